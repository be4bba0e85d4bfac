"""The CPU GEMM kernels a cpu engine can run, timed at the step shapes that serving runs.

One decoder stack of a model's linear layers (default Gemma 3 270M: 18 layers of q/k/v/o,
gate/up, down; the vocabulary projection separately) is written as an ONNX graph in each weight
form and run at M = 1, 16 and 128 rows (a decode step, a 16-sequence decode step, a 128-token
prefill) on each runtime:

- ``ort``: ONNX Runtime's CPU EP at ``ORT_ENABLE_ALL`` with the engine's session options
  (``llmc.runtime.runners.ort_env``). int4/w8 (block-wise DequantizeLinear -> MatMul) become
  ``MatMulNBits`` with int8 compute (accuracy level 4, as the engines run them); ``dq8`` is
  ``DynamicQuantizeMatMul`` (activations quantized per tensor per call, int8 weights per output
  channel: MLAS's u8s8 GEMM, VNNI where the CPU has it).
- ``ort-llmc``: the same graph optimized by ONNX Runtime, then its 8-bit ``MatMulNBits`` (w8;
  int4's ``down``; the projection under w8) on llmc's ``BlockInt8MatMul``, as a cpu engine runs
  on an AVX-512 VNNI host (``llmc.compiler.backends.onnxruntime.rewrites.int8_matmul``).
- ``ov``, ``ov-bf16``: OpenVINO's runtime compiling the same ONNX graph (weights it sees as
  compressed: DequantizeLinear of int4/int8 constants; f32 or bf16 inference precision).

Weights are random (timing does not depend on values); the layers are chained (each layer's
``down`` output feeds the next layer's input) so no runtime can skip one. Reported: the median
milliseconds of a run, and the multiply-adds per second it reached.

    python benchmarks/bench_cpu_gemm.py                        # every form and runtime
    python benchmarks/bench_cpu_gemm.py --forms int4,dq8 --runtimes ort --json gemm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from bench_build_scale import host_line  # benchmarks/ is the script's directory
from onnx import TensorProto, helper, numpy_helper

GEMMA_3_270M = dict(hidden=640, q=1024, kv=256, intermediate=2048, layers=18, vocab=262144)
FORMS = ("f32", "int4", "w8", "dq8")
RUNTIMES = ("ort", "ort-llmc", "ov", "ov-bf16")
BLOCK = 128
MS = "com.microsoft"


def _linear(name: str, x: str, k: int, n: int, form: str, rng, nodes, inits, block: int) -> str:
    """Append ``x [M, k] @ W [k, n]`` in ``form`` (int4/w8: one scale per ``block`` input
    channels); return the output's name."""
    out = f"{name}.y"
    if form == "f32":
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}.w"))
        nodes.append(helper.make_node("MatMul", [x, f"{name}.w"], [out]))
        return out
    if form == "dq8":
        codes = rng.integers(-127, 128, (k, n), dtype=np.int8)
        scale = np.full(n, 1 / (127 * np.sqrt(k)), np.float32)
        inits.append(numpy_helper.from_array(codes, f"{name}.q"))
        inits.append(numpy_helper.from_array(scale, f"{name}.s"))
        inputs = [x, f"{name}.q", f"{name}.s"]
        nodes.append(helper.make_node("DynamicQuantizeMatMul", inputs, [out], domain=MS))
        return out
    bits = 4 if form == "int4" else 8
    lo, hi = (-8, 8) if bits == 4 else (-127, 128)
    codes = rng.integers(lo, hi, (k, n)).astype(np.int8)
    scale = np.full((k // block, n), 1 / ((hi - 1) * np.sqrt(k)), np.float32)
    dtype = TensorProto.INT4 if bits == 4 else TensorProto.INT8
    inits.append(helper.make_tensor(f"{name}.q", dtype, [k, n], codes.flatten().tolist()))
    inits.append(numpy_helper.from_array(scale, f"{name}.s"))
    nodes.append(
        helper.make_node(
            "DequantizeLinear", [f"{name}.q", f"{name}.s"], [f"{name}.w"], axis=0, block_size=block
        )
    )
    nodes.append(helper.make_node("MatMul", [x, f"{name}.w"], [out]))
    return out


def stack_model(dims: dict, form: str, seed: int = 0) -> onnx.ModelProto:
    """The decoder stack's linear layers in ``form``, fused as the engines fuse them (q/k/v in
    one GEMM, gate/up in one; ``llmc.compiler.passes.parallel_matmul``), ``down`` 8-bit
    weight-only under int4 (its default): input ``x`` [M, hidden], outputs the last layer's
    ``down`` [M, hidden] and every layer's q/k/v."""
    rng = np.random.default_rng(seed)
    nodes, inits, outputs = [], [], []
    h, q, f, x = dims["hidden"], dims["q"], dims["intermediate"], "x"
    down_form = "w8" if form == "int4" else form
    for i in range(dims["layers"]):
        p = f"l{i}"
        qkv = _linear(f"{p}.qkv", x, h, q + 2 * dims["kv"], form, rng, nodes, inits, dims["block"])
        outputs.append(qkv)
        nodes.append(helper.make_node("Slice", [qkv, "zero", "q_end", "one"], [f"{p}.q"]))
        o = _linear(f"{p}.o", f"{p}.q", q, h, form, rng, nodes, inits, dims["block"])
        gu = _linear(f"{p}.gate_up", o, h, 2 * f, form, rng, nodes, inits, dims["block"])
        nodes.append(helper.make_node("Split", [gu], [f"{p}.g", f"{p}.u"], axis=1, num_outputs=2))
        nodes.append(helper.make_node("Mul", [f"{p}.g", f"{p}.u"], [f"{p}.m"]))
        x = _linear(f"{p}.down", f"{p}.m", f, h, down_form, rng, nodes, inits, dims["block"])
    outputs.append(x)
    for name, value in (("zero", 0), ("one", 1), ("q_end", q)):
        inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
    return _model(nodes, inits, h, outputs)


def projection_model(dims: dict, form: str, seed: int = 0) -> onnx.ModelProto:
    """The vocabulary projection alone: ``x`` [M, hidden] -> logits [M, vocab]."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    y = _linear(
        "lm_head", "x", dims["hidden"], dims["vocab"], form, rng, nodes, inits, dims["block"]
    )
    return _model(nodes, inits, dims["hidden"], [y])


def _model(nodes, inits, hidden: int, outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", hidden])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _llmc_kernels(path: Path) -> Path:
    """``path`` optimized by ONNX Runtime (as a cpu build lowers a segment), its 8-bit
    MatMulNBits then put on llmc's BlockInt8MatMul; the rewritten model's path."""
    import onnxruntime as ort

    from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import rewrite_block_int8
    from llmc.runtime.runners.ort_env import session_options

    optimized = path.with_suffix(".optimized.onnx")
    opts = session_options(2)
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "4")
    opts.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    model = onnx.load(str(optimized))
    rewrite_block_int8(model)
    rewritten = path.with_suffix(".llmc.onnx")
    onnx.save(model, str(rewritten), save_as_external_data=True, location=rewritten.name + ".data")
    return rewritten


def make_runner(runtime: str, path: Path):
    """A callable ``x -> outputs`` of ``path`` on ``runtime``."""
    if runtime in ("ort", "ort-llmc"):
        import onnxruntime as ort

        from llmc.plugins.paged_attention import ort_op
        from llmc.runtime.runners.ort_env import session_options

        opts = session_options(2)
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "4")
        if runtime == "ort-llmc":
            if not ort_op.register(opts):
                raise RuntimeError("the llmc custom-op library is not built")
            path = _llmc_kernels(path)
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return lambda x: sess.run(None, {"x": x})
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"}
    config["INFERENCE_PRECISION_HINT"] = "bf16" if runtime == "ov-bf16" else "f32"
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()
    return lambda x: request.infer({0: x})


def time_runner(run, m: int, hidden: int, seconds: float) -> float:
    """Median milliseconds of ``run`` on an [m, hidden] input (two warmups, then runs for about
    ``seconds``, at least 3)."""
    x = np.random.default_rng(1).standard_normal((m, hidden)).astype(np.float32)
    run(x)
    run(x)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < end:
        start = time.perf_counter()
        run(x)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def macs(dims: dict, part: str) -> int:
    """Multiply-adds per row of ``part`` ("stack" or "projection")."""
    if part == "projection":
        return dims["hidden"] * dims["vocab"]
    h, q, kv, f = dims["hidden"], dims["q"], dims["kv"], dims["intermediate"]
    return dims["layers"] * (h * (q + 2 * kv) + q * h + 2 * h * f + f * h)


def measure(runtime: str, path: Path, rows: list[int], hidden: int, seconds: float) -> dict:
    """Median ms per row count of ``path`` on ``runtime``; raises what the runtime raises."""
    run = make_runner(runtime, path)
    return {m: time_runner(run, m, hidden, seconds) for m in rows}


def main(argv: list[str] | None = None) -> int:
    """Time every (part, form, runtime) cell at each ``--rows`` count and print a Markdown
    table of median ms and GMAC/s (``--json`` also writes them, ms keyed by row count). A
    runtime that cannot compile a form is printed as failed and the rest go on. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--rows", default="1,16,128")
    parser.add_argument("--parts", default="stack,projection")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per cell")
    parser.add_argument("--block", type=int, default=BLOCK, help="int4/w8 channels per scale")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    dims = dict(GEMMA_3_270M, block=args.block)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"host: {host_line()}")
    print("| part | form | runtime | " + " | ".join(f"M={m} ms (GMAC/s)" for m in rows) + " |")
    print("|---|---|---|" + "---|" * len(rows))
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts.split(","):
            make = stack_model if part == "stack" else projection_model
            for form in args.forms.split(","):
                path = Path(tmp) / f"{part}_{form}.onnx"
                onnx.save(make(dims, form), path, save_as_external_data=True)
                for runtime in args.runtimes.split(","):
                    if form == "dq8" and runtime != "ort":
                        continue  # a contrib op: ONNX Runtime only
                    if runtime == "ort-llmc" and form not in ("w8", "int4"):
                        continue  # no 8-bit MatMulNBits to rewrite
                    try:
                        cells = measure(runtime, path, rows, dims["hidden"], args.seconds)
                    except Exception as e:  # a runtime that cannot run the form: say so, go on
                        print(f"| {part} | {form} | {runtime} | failed: {str(e)[:100]} |")
                        continue
                    per_row = macs(dims, part)
                    text = " | ".join(
                        f"{t:.2f} ({m * per_row / t / 1e6:.0f})" for m, t in cells.items()
                    )
                    print(f"| {part} | {form} | {runtime} | {text} |", flush=True)
                    records.append(dict(part=part, form=form, runtime=runtime, ms=cells))
    if args.json:
        args.json.write_text(json.dumps({"host": host_line(), "runs": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
