"""The quantization stages of ``llmc build``: data, calibration (cached), Q/DQ rewrite, and the
checks after lowering (fast path taken, accuracy against the unquantized graph).

Data: ``--calib-data`` gives calibration text (its first 80%); the accuracy report reads
held-out text (the last 20% of ``--eval-data``, else of ``--calib-data``), so the two never
overlap. With no file, both are sampled from the model itself, with different seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from llmc.compiler.build_config import BuildConfig
from llmc.compiler.quantize.qdq import QuantReport, QuantSpec
from llmc.errors import LlmcError

CALIBRATION_SEED = 0
HELDOUT_SEED = 1
# int8 compute inside MatMulNBits (ORT "accuracy level 4"): activations quantized per block to
# int8, so int4/int8 weights run on VNNI; level 0 (float compute) was 3-8x slower here.
MATMULNBITS_ACCURACY_LEVEL = 4


class FastPathError(LlmcError):
    """The optimized engine graph does not run quantized layers on the kernels they were meant
    for (ORT did not fuse the Q/DQ pattern)."""


@dataclass(frozen=True)
class TextSource:
    """Where text comes from: a file and its split, or samples from the model with a seed."""

    path: str | None
    part: str  # "calibration" | "heldout"
    seed: int

    def describe(self) -> str:
        if self.path is None:
            from llmc.calibration.data import sampled_label

            return sampled_label(self.seed)
        where = "first 80%" if self.part == "calibration" else "last 20%"
        return f"{Path(self.path).resolve()} ({where})"

    def digest(self) -> str:
        if self.path is None:
            return f"sampled:{self.seed}"
        return hashlib.sha256(Path(self.path).read_bytes()).hexdigest() + ":" + self.part


def spec_of(config: BuildConfig, bound_pairs: bool = False) -> QuantSpec:
    """The quantization options of ``config`` (defaults per ``--quant`` resolved) as a
    ``QuantSpec``; ``bound_pairs`` as in ``quantize``."""
    return QuantSpec(
        quant=config.quant,
        calib_method=config.calib_method_for_quant,
        smoothquant_alpha=config.smoothquant_alpha,
        smoothquant_alphas=config.smoothquant_alphas,
        int4_block_size=config.int4_block_size,
        int4_method=config.int4_method,
        weight_rounding=config.weight_rounding,
        weight_only8=config.weight_only8_patterns,
        exclude=config.exclude_patterns,
        kv_cache_dtype=config.kv_cache_dtype,
        bound_pairs=bound_pairs,
    )


def text_sources(config: BuildConfig) -> tuple[TextSource, TextSource]:
    """(calibration, held-out) sources; reads the files now so that an empty or unreadable one
    fails before any work (raises ``CalibrationDataError``)."""
    from llmc.calibration.data import read_texts

    for path in (config.calib_data, config.eval_data):
        if path:
            read_texts(path)
    calib = TextSource(config.calib_data, "calibration", CALIBRATION_SEED)
    held = config.eval_data or config.calib_data
    return calib, TextSource(held, "heldout", HELDOUT_SEED)


def windows_of(source: TextSource, model, tokenizer, num: int, seq_len: int) -> list[np.ndarray]:
    """Token windows [seq_len] int64 of ``source`` (see ``llmc.calibration.data.load_windows``)."""
    from llmc.calibration.data import load_windows

    windows, _ = load_windows(source.part, source.path, model, tokenizer, num, seq_len)
    return windows


def quantize(
    config: BuildConfig,
    float_model: onnx.ModelProto,
    hf_model,
    tokenizer,
    checkpoint_digest: str,
    calib_source: TextSource,
    stage,
    bound_pairs: bool = False,
) -> tuple[onnx.ModelProto, QuantReport]:
    """Calibrate (or load cached statistics) and return the Q/DQ graph and its report.
    ``bound_pairs``: int8 weight pairs within 128 (CPU hosts without VNNI, see ``formats``)."""
    import onnx_ir as ir

    from llmc.calibration.collect import calibration_key, collect_stats, load_stats, save_stats
    from llmc.compiler.quantize.qdq import calibration_tensors, gptq_keys, quantize_graph
    from llmc.runtime.ort_runner import OrtRunner
    from llmc.version import __version__

    spec = spec_of(config, bound_pairs)
    graph = ir.from_proto(float_model)
    tensors = calibration_tensors(graph, spec)
    gram_keys = gptq_keys(graph, spec)
    key = calibration_key(
        model=checkpoint_digest,
        data=calib_source.digest(),
        samples=config.calib_samples,
        seq_len=config.calib_seq_len,
        method=config.calib_method_for_quant,
        tensors=sorted(tensors),
        gram=sorted(gram_keys),
        llmc=__version__,
    )
    cache = Path(config.cache_dir).expanduser() / "calibration" / f"{key}.npz"
    stats = load_stats(cache)
    if stats is None or not set(tensors) <= set(stats):
        with stage("calibration data"):
            windows = windows_of(
                calib_source, hf_model, tokenizer, config.calib_samples, config.calib_seq_len
            )
        with stage(f"calibrate ({len(windows)} x {config.calib_seq_len} tokens)") as tick:
            blocks = -(-config.calib_seq_len // config.block_size)
            runner = OrtRunner.from_model(
                float_model,
                blocks,
                threads=config.threads,
                extra_outputs=tuple(dict.fromkeys(tensors.values())),
            )
            stats = collect_stats(runner, tensors, windows, progress=tick, gram_keys=gram_keys)
            del runner
            save_stats(stats, cache)
    with stage(f"quantize ({config.quant})"):
        report = quantize_graph(graph, stats, spec)
        report.spec["calibration"] = {
            "data": calib_source.describe(),
            "samples": config.calib_samples,
            "seq_len": config.calib_seq_len,
            "cache_key": key,
        }
        return ir.to_proto(graph), report


def session_config(quant: str) -> dict[str, str]:
    """ORT session config entries the lowering of a ``quant`` engine needs."""
    if quant == "int4":
        return {"session.qdq_matmulnbits_accuracy_level": str(MATMULNBITS_ACCURACY_LEVEL)}
    return {}


def emulate_fp8_weights(model: onnx.ModelProto) -> int:
    """CPU lowering of FP8 engines: replace each FP8 weight DequantizeLinear by the float32
    weight it produces (the same values, computed once at build time); returns how many.

    ONNX Runtime's CPU EP has no FP8 GEMM, and its QDQ fusion turns an FP8 DQ + MatMul into
    MatMulIntegerToFloat, which then rejects float8 inputs at load (measured, ORT 1.31). With
    float weights the activation Q/DQ pairs stay and run as emulation, while the int8
    weight-only layers of the same engine still fuse into MatMulNBits. The portable graph (for
    TensorRT) keeps the FP8 weight DQ nodes.
    """
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    done = 0
    for node in list(g.node):
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        data = inits[node.input[0]]
        if data.data_type != fp8:
            continue
        q = numpy_helper.to_array(data).astype(np.float32)
        scale = numpy_helper.to_array(inits[node.input[1]])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        w = q * (scale[None, :] if axis == 1 else scale[:, None])
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), node.output[0]))
        g.node.remove(node)
        done += 1
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return done


def check_fast_path(quant: str, counts: dict[str, int], optimized_ops: dict[str, int]) -> dict:
    """Compare the fused kernels in the optimized graph with what was quantized: W8A8 int8 as
    MatMulIntegerToFloat, weight-only int4/int8 as MatMulNBits, FP8 as Q/DQ emulation (its
    activation QuantizeLinear nodes remain). Returns {op: {"expected", "found"}}, stored in the
    manifest. Raises FastPathError when ORT did not fuse them all."""
    expected = {
        "MatMulIntegerToFloat": counts.get("int8_w8a8", 0),
        "MatMulNBits": counts.get("int4_weight_only", 0) + counts.get("int8_weight_only", 0),
        "QuantizeLinear": counts.get("fp8_w8a8", 0),
    }
    record = {
        op: {"expected": n, "found": int(optimized_ops.get(op, 0))}
        for op, n in expected.items()
        if n
    }
    short = {op: r for op, r in record.items() if r["found"] < r["expected"]}
    if short:
        detail = ", ".join(
            f"{r['found']} {op} (expected {r['expected']})" for op, r in short.items()
        )
        raise FastPathError(
            f"--quant {quant}: the optimized engine has {detail}; ONNX Runtime did not fuse "
            "every Q/DQ MatMul, so the engine would run dequantized float32 weights. Optimized "
            f"op counts: {optimized_ops}"
        )
    return record


def accuracy_report(
    config: BuildConfig,
    reference: onnx.ModelProto,
    engine_dir: Path,
    hf_model,
    tokenizer,
    source: TextSource,
    progress,
):
    """The engine in ``engine_dir`` against the unquantized graph on held-out windows
    (``llmc.calibration.accuracy.AccuracyReport``)."""
    from llmc.calibration.accuracy import evaluate_accuracy
    from llmc.runtime.ort_runner import OrtRunner

    windows = windows_of(source, hf_model, tokenizer, config.eval_samples, config.calib_seq_len)
    blocks = -(-config.calib_seq_len // config.block_size)
    ref = OrtRunner.from_model(reference, blocks, threads=config.threads)
    engine = OrtRunner(engine_dir, blocks, threads=config.threads)
    return evaluate_accuracy(
        ref, engine, windows, config.block_size, data=source.describe(), progress=progress
    )
