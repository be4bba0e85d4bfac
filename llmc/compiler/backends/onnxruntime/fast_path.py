"""Whether ONNX Runtime fused every quantized MatMul of a cpu engine into its kernel."""

from __future__ import annotations

from llmc.compiler.backends.onnxruntime.rewrites.int8_matmul import OP_TYPE as BLOCK_INT8
from llmc.compiler.quantize.formats import FORMATS
from llmc.errors import LlmcError

#: ORT's fused kernel whose nodes the single graph may run on an llmc kernel instead.
RUNS_AS = {"MatMulNBits": BLOCK_INT8}


class FastPathError(LlmcError):
    """The optimized engine graph does not run quantized layers on the kernels they were meant
    for (ORT did not fuse the Q/DQ pattern)."""


def check_fast_path(quant: str, counts: dict[str, int], optimized_ops: dict[str, int]) -> dict:
    """Compare the fused kernels in the optimized graph with what was quantized (``counts``, by
    report label): each format's modules as its ``cpu_kernel`` (W8A8 int8 as
    MatMulIntegerToFloat, weight-only int4/int8 as MatMulNBits, FP8 as Q/DQ emulation: its
    activation QuantizeLinear nodes remain). Returns {op: {"expected", "found"}}, stored in the
    manifest, with ``"runs_as": {llmc_op: n}`` where ``engine.onnx`` runs n of them on llmc's
    kernel (``optimized_ops`` counts the single graph's llmc nodes: 8-bit MatMulNBits as
    BlockInt8MatMul). Raises FastPathError when ORT did not fuse them all."""
    expected: dict[str, int] = {}
    for f in FORMATS.values():
        if f.cpu_kernel and counts.get(f.label):
            expected[f.cpu_kernel] = expected.get(f.cpu_kernel, 0) + counts[f.label]
    record = {
        op: {"expected": n, "found": int(optimized_ops.get(op, 0))}
        for op, n in sorted(expected.items())
    }
    for op, r in record.items():
        llmc_op = RUNS_AS.get(op)
        if llmc_op and optimized_ops.get(llmc_op):
            r["runs_as"] = {llmc_op: int(optimized_ops[llmc_op])}
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
