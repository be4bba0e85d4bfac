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
        if self.path:
            return f"{self.path} ({'first 80%' if self.part == 'calibration' else 'last 20%'})"
        return f"text sampled from the model (seed {self.seed})"

    def digest(self) -> str:
        if self.path is None:
            return f"sampled:{self.seed}"
        return hashlib.sha256(Path(self.path).read_bytes()).hexdigest() + ":" + self.part


def spec_of(config: BuildConfig) -> QuantSpec:
    return QuantSpec(
        quant=config.quant,
        calib_method=config.calib_method,
        smoothquant_alpha=config.smoothquant_alpha,
        int4_block_size=config.int4_block_size,
        int4_method=config.int4_method,
        int4_lm_head_bits=config.int4_lm_head_bits,
        exclude=config.exclude_patterns,
        kv_cache_dtype=config.kv_cache_dtype,
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
    """Token windows [seq_len] int64 of ``source``."""
    from llmc.calibration.data import read_texts, sample_texts, split_texts, token_windows

    if source.path:
        texts = split_texts(read_texts(source.path), source.part)
    else:
        texts = sample_texts(model, tokenizer, num, seq_len, source.seed)
    return token_windows(texts, tokenizer, num, seq_len)


def quantize(
    config: BuildConfig,
    float_model: onnx.ModelProto,
    hf_model,
    tokenizer,
    checkpoint_digest: str,
    calib_source: TextSource,
    stage,
) -> tuple[onnx.ModelProto, QuantReport]:
    """Calibrate (or load cached statistics) and return the Q/DQ graph and its report."""
    import onnx_ir as ir

    from llmc.calibration.collect import calibration_key, collect_stats, load_stats, save_stats
    from llmc.compiler.quantize.qdq import calibration_tensors, quantize_graph
    from llmc.runtime.ort_runner import OrtRunner
    from llmc.version import __version__

    spec = spec_of(config)
    graph = ir.from_proto(float_model)
    tensors = calibration_tensors(graph, spec)
    key = calibration_key(
        model=checkpoint_digest,
        data=calib_source.digest(),
        samples=config.calib_samples,
        seq_len=config.calib_seq_len,
        method=config.calib_method,
        tensors=tensors,
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
                float_model, blocks, threads=config.threads, extra_outputs=tuple(tensors)
            )
            stats = collect_stats(runner, tensors, windows, progress=tick)
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


def disabled_optimizers(quant: str) -> list[str]:
    """ORT transformers a ``quant`` engine must be lowered without. ORT 1.31's QDQ fusion turns
    FP8 DQ + MatMul into MatMulIntegerToFloat, which rejects float8 inputs at load (measured);
    FP8 engines keep their Q/DQ nodes and run as emulation."""
    return ["QDQSelectorActionTransformer"] if quant == "fp8" else []


def check_fast_path(quant: str, counts: dict[str, int], optimized_ops: dict[str, int]) -> dict:
    """Compare the fused kernels in the optimized graph with what was quantized; returns the
    record stored in the manifest. Raises FastPathError when ORT did not fuse them all."""
    if quant == "int8":
        op, expected = "MatMulIntegerToFloat", counts.get("int8_w8a8", 0)
    elif quant == "int4":
        op = "MatMulNBits"
        expected = counts.get("int4_weight_only", 0) + counts.get("int8_weight_only", 0)
    else:  # fp8 runs as Q/DQ emulation on the CPU EP: the activation Q nodes must remain
        op, expected = "QuantizeLinear", counts.get("fp8_w8a8", 0)
    found = int(optimized_ops.get(op, 0))
    record = {"op": op, "expected": expected, "found": found}
    if found < expected:
        raise FastPathError(
            f"--quant {quant}: the optimized engine has {found} {op} nodes, expected {expected}; "
            "ONNX Runtime did not fuse every Q/DQ MatMul, so the engine would run dequantized "
            f"float32 weights. Optimized op counts: {optimized_ops}"
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
