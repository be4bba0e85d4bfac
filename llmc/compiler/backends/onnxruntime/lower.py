"""Lower an engine graph to the CPU target: ONNX Runtime segments optimized for this host.

A graph saved by ONNX Runtime at ``ORT_ENABLE_ALL`` is specific to the hardware it was optimized
on (DESIGN §6), which is what makes it the per-ISA CPU engine. Each segment between plugin nodes
(``llmc.engine.split``) is optimized once at build time and saved with its weights as external
data; the runtime loads the saved graphs with graph optimizations off.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import onnx
from onnx import helper

from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import OP_TYPE as BLOCK_INT8
from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import rewrite_block_int8
from llmc.compiler.backends.onnxruntime.rewrites.qkv_rope import OP_TYPE as QKV_ROPE
from llmc.compiler.backends.onnxruntime.rewrites.qkv_rope import fuse_qkv_rope
from llmc.compiler.backends.onnxruntime.rewrites.quantized_embedding import gather_from_projection
from llmc.compiler.backends.onnxruntime.rewrites.rms_norm import (
    NORM_SKIP_OP,
    fuse_norm_into_skip,
    rewrite_rms_norms,
)
from llmc.compiler.backends.onnxruntime.rewrites.rms_norm import PLAIN_OP as NORM_OP
from llmc.compiler.backends.onnxruntime.rewrites.rms_norm import SKIP_OP as SKIP_NORM_OP
from llmc.compiler.backends.onnxruntime.rewrites.skip_norm import (
    fuse_skip_rms_norm,
    use_simplified_layer_norm,
)
from llmc.compiler.backends.onnxruntime.rewrites.split_projection import split_projections
from llmc.compiler.backends.onnxruntime.single_graph import write_single_graph
from llmc.compiler.weights.shared_weights import compact_files, share_weights
from llmc.compiler.weights.stored_weights import widen_segment
from llmc.engine.plan import ExecutionPlan, save_plan
from llmc.engine.plugin import FPMATH_ATTRIBUTE, plugin_nodes
from llmc.engine.provider import CPU_EP, provider_for_dtype
from llmc.engine.split import split_at_plugins
from llmc.runtime.runners.ort_env import session_options

SEGMENT_DIR = "segments"


def _optimize_segment(
    model: onnx.ModelProto,
    out_path: Path,
    threads: int,
    config: dict[str, str],
    external_data_dir: Path | None = None,
) -> Counter:
    import onnxruntime as ort

    opts = session_options(threads)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # the "hardware specific" warning is the point of this step
    opts.optimized_model_filepath = str(out_path)
    opts.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", out_path.name + ".data"
    )
    opts.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "4096"
    )
    for key, value in config.items():
        opts.add_session_config_entry(key, value)
    if external_data_dir is not None:  # the segment's weights are external data there
        opts.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(external_data_dir)
        )
    ort.InferenceSession(
        model.SerializeToString(),
        opts,
        providers=["CPUExecutionProvider"],
    )
    optimized = onnx.load(str(out_path), load_external_data=False)
    return Counter(n.op_type for n in optimized.graph.node)


def _save_portable_segment(
    model: onnx.ModelProto, out_path: Path, choice, threads: int, external_data_dir: Path | None
) -> Counter:
    """Save the segment as it is (the provider compiles it at load) and check that ONNX
    Runtime loads it on the CPU EP: a valid graph on every host. Whether ``choice``'s provider
    runs it is measured by the provider choice, which rejects a provider that fails."""
    import onnxruntime as ort
    from onnx.external_data_helper import load_external_data_for_model

    if external_data_dir is not None:  # this segment's weights only
        load_external_data_for_model(model, str(external_data_dir))

    onnx.save(
        model,
        str(out_path),
        save_as_external_data=True,
        location=out_path.name + ".data",
        size_threshold=4096,
    )
    opts = session_options(threads)
    opts.log_severity_level = 3
    ort.InferenceSession(str(out_path), opts, providers=[CPU_EP])
    return Counter(n.op_type for n in model.graph.node)


def set_fpmath_mode(model: onnx.ModelProto, mode: str) -> int:
    """Set ``fpmath_mode`` = ``mode`` (one of ``FPMATH_MODES``) on every PagedAttention node of
    ``model``'s main graph, in place; returns how many."""
    nodes = plugin_nodes(model)
    for node in nodes:
        kept = [a for a in node.attribute if a.name != FPMATH_ATTRIBUTE]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(FPMATH_ATTRIBUTE, mode)])
    return len(nodes)


def _llmc_kernels(graph_path: Path, block_int8: bool, llmc_norms: bool) -> Counter:
    """Put llmc's custom ops in the single graph at ``graph_path`` (rewritten in place): the
    block-int8 MatMul, then the RMS norms, the fused q/k norm and rotary, and the norm before a
    residual add. Returns the count of each op the graph got."""
    if not (block_int8 or llmc_norms):
        return Counter()
    graph = onnx.load(str(graph_path), load_external_data=False)
    single: Counter = Counter()
    if block_int8:
        single[BLOCK_INT8] = rewrite_block_int8(graph)
    if llmc_norms and rewrite_rms_norms(graph):
        single[QKV_ROPE] = fuse_qkv_rope(graph)  # needs the llmc norms
        fuse_norm_into_skip(graph)
        kinds = Counter(n.op_type for n in graph.graph.node)
        single.update({op: kinds[op] for op in (NORM_OP, SKIP_NORM_OP, NORM_SKIP_OP)})
    single = +single  # the ops the single graph got
    if single:
        onnx.save(graph, str(graph_path))
    return single


def lower_to_cpu(
    model: onnx.ModelProto,
    engine_dir: Path,
    threads: int = 2,
    progress=None,
    choice=None,
    session_config: dict[str, str] | None = None,
    external_data_dir: Path | None = None,
    block_int8: bool = False,
    llmc_norms: bool = False,
    attention_fpmath: str = "strict",
) -> tuple[ExecutionPlan, dict[str, int]]:
    """Write ``plan.json`` and ``segments/segment_*.onnx`` (+ ``.data``) into ``engine_dir``, and
    for the CPU EP ``engine.onnx``, the segments joined into one graph (``single_graph.py``).

    ``choice`` (``execution_provider.ProviderChoice``, default: the CPU EP) decides whether the
    segments are optimized by ORT now (CPU EP) or saved portable for the provider to compile at
    load (OpenVINO); ``session_config`` holds ORT session config entries for the optimization
    (e.g. MatMulNBits' accuracy level); ``external_data_dir`` is where the weights of a
    ``model`` holding external-data references are (a streamed build); ``block_int8`` puts
    ``llmc::BlockInt8MatMul`` in the single graph in place of 8-bit MatMulNBits
    (``rewrites.int8_matmul``; the host must run it), and ``llmc_norms`` ``llmc::RMSNorm`` and
    ``llmc::SkipRMSNorm`` in place of ORT's norm kernels (``rewrites.rms_norm``), then
    ``llmc::QKVRoPE`` in place of the q/k norm and rotary nodes (``rewrites.qkv_rope``) and
    ``llmc::NormSkipRMSNorm`` for a sublayer's norm followed by the residual add and norm;
    ``attention_fpmath`` is written on every PagedAttention node as its ``fpmath_mode``
    (``llmc.engine.plugin.FPMATH_ATTRIBUTE``; "bf16": prefill on AMX-BF16 tiles). Returns
    the plan and the op counts of the saved segments (recorded in the manifest), with the
    single graph's llmc nodes.
    ``progress(done, total)`` is called after each segment. Raises onnxruntime errors if a
    segment does not load.
    """

    choice = choice or provider_for_dtype("float32")
    seg_dir = engine_dir / SEGMENT_DIR
    seg_dir.mkdir(parents=True, exist_ok=True)
    ops: Counter = Counter()
    if attention_fpmath != "strict":
        ops[f"PagedAttention {FPMATH_ATTRIBUTE}={attention_fpmath}"] = set_fpmath_mode(
            model, attention_fpmath
        )
    segments, plan = split_at_plugins(model, file_pattern=SEGMENT_DIR + "/segment_{:03d}.onnx")
    for i, (seg, spec) in enumerate(zip(segments, plan.segments, strict=True)):
        if choice.optimize_at_build:
            scratch = Path(spec.file).name + ".widened.data"
            if external_data_dir is not None:  # a float graph's 16-bit weights as float32
                seg = widen_segment(seg, external_data_dir, scratch)
            fuse_skip_rms_norm(seg)  # residual Add + RMSNorm: one ORT kernel
            use_simplified_layer_norm(seg)  # the other norms: ORT's cheaper kernel
            ops += _optimize_segment(
                seg,
                engine_dir / spec.file,
                threads,
                session_config or {},
                external_data_dir,
            )
            if external_data_dir is not None:
                (external_data_dir / scratch).unlink(missing_ok=True)
        else:
            ops += _save_portable_segment(
                seg, engine_dir / spec.file, choice, threads, external_data_dir
            )
        if progress is not None:
            progress(i + 1, len(segments))
    files = [engine_dir / spec.file for spec in plan.segments]
    models = {f: onnx.load(str(f), load_external_data=False) for f in files}
    share_weights(models)  # a tied table once
    gather_from_projection(models)  # a quantized engine's lookup reads the quantized table
    compact_files(models)
    if choice.optimize_at_build:
        split_projections(models)  # ONNX Runtime packs a large projection a block at a time
        plan = replace(plan, graph=write_single_graph(engine_dir, plan))
        ops.update(_llmc_kernels(engine_dir / plan.graph, block_int8, llmc_norms))
    save_plan(plan, engine_dir)
    return plan, dict(sorted(ops.items()))
