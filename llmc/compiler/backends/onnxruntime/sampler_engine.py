"""The engine that samples a build's calibration text: the float graph with every MatMul weight
rounded to 8 bits (per block, round-to-nearest, no calibration), lowered for this host.

A build without ``--calib-data`` calibrates on text the model writes itself, and generating text
needs every layer at every step, so it cannot run one segment at a time as calibration does.
Run on the float graph it would hold all the float32 weights (4.4 GB for a 1.1B model) and set
the build's peak memory; 8-bit weight-only weights take a quarter of that and decode faster
(decode reads every weight once per step). Round-to-nearest 8-bit weights with a scale per block
of 32 change a model's next-token distribution far less than the sampling temperature of 1
does, so the text is the model's own for calibration purposes; the accuracy report still
compares the engine with the float graph.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir

from llmc.compiler.backends.onnxruntime.lower import lower_to_cpu
from llmc.compiler.frontend.streamed_export import load_float_graph
from llmc.compiler.quantize.formats import FORMATS, WEIGHT_ONLY8
from llmc.compiler.quantize.qdq import GraphQuantizer
from llmc.engine.isa import detect_host_isa
from llmc.heap import release_freed_memory
from llmc.plugins.int8_matmul import block_int8_matmul_isa
from llmc.plugins.paged_attention import ort_op
from llmc.quant.protocol import QuantSpec

SAMPLER_GRAPH = "sampler.onnx"
SAMPLER_ENGINE = "sampler_engine"


def write_sampler_engine(
    graph: onnx.ModelProto, weights_dir: Path | None, work_dir: Path, threads: int
) -> Path:
    """Quantize ``graph`` (the float engine graph; its weights as external data in
    ``weights_dir``, or in the proto) to 8-bit weight-only, lower it into ``work_dir /
    SAMPLER_ENGINE`` and return that directory (an engine directory ``OrtRunner`` loads), on
    the kernels an engine built on this host runs (``llmc::BlockInt8MatMul`` and llmc's norms
    where the host has them, as ``host.plan_cpu``). Weights are read one at a time and written
    as external data."""
    model = load_float_graph(weights_dir) if weights_dir else ir.from_proto(graph)
    GraphQuantizer(model, QuantSpec(quant=WEIGHT_ONLY8)).finish()
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / SAMPLER_GRAPH
    ir.save(model, path, external_data=SAMPLER_GRAPH + ".data", max_in_flight_bytes=256 << 20)
    del model
    release_freed_memory()  # the graph is a reference cycle holding the 8-bit weights
    engine_dir = work_dir / SAMPLER_ENGINE
    lower_to_cpu(
        onnx.load(str(path), load_external_data=False),
        engine_dir,
        threads,
        session_config=dict(FORMATS[WEIGHT_ONLY8].ort_session_config),
        external_data_dir=work_dir,
        block_int8=block_int8_matmul_isa(detect_host_isa().features) is not None,
        llmc_norms=ort_op.library_path() is not None,
    )
    return engine_dir
