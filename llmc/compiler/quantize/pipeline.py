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
from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.qdq import QuantReport
from llmc.errors import LlmcError

#: The quantized graph of a streamed build, written in its work directory.
QUANTIZED_GRAPH = "quantized.onnx"

CALIBRATION_SEED = 0
HELDOUT_SEED = 1


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


def text_sources(options: CalibrationOptions) -> tuple[TextSource, TextSource]:
    """(calibration, held-out) sources; reads the files now so that an empty or unreadable one
    fails before any work (raises ``CalibrationDataError``)."""
    from llmc.calibration.data import read_texts

    for path in (options.calib_data, options.eval_data):
        if path:
            read_texts(path)
    calib = TextSource(options.calib_data, "calibration", CALIBRATION_SEED)
    held = options.eval_data or options.calib_data
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
    weights_dir: Path | None = None,
    work_dir: Path | None = None,
) -> tuple[onnx.ModelProto, QuantReport]:
    """Calibrate (or load cached statistics) and return the Q/DQ graph and its report.
    ``bound_pairs``: int8 weight pairs within 128 (CPU hosts without VNNI, see ``formats``).

    A streamed float graph (``float_model`` holding external-data references to
    ``weights_dir / FLOAT_GRAPH.data``) is calibrated by ONNX Runtime reading the weights from
    disk, quantized with each weight read when its layer is quantized, and written to
    ``work_dir`` with its weights as external data; the returned proto then references them.
    ``hf_model`` is only read to sample calibration text (no ``--calib-data``)."""
    import onnx_ir as ir

    from llmc.calibration.collect import calibration_key, collect_stats, load_stats, save_stats
    from llmc.compiler.quantize.qdq import calibration_tensors, gptq_keys, quantize_graph
    from llmc.compiler.streaming_export import FLOAT_GRAPH
    from llmc.runtime.ort_runner import OrtRunner
    from llmc.version import __version__

    spec = config.quant_spec(bound_pairs)
    calib = config.calibration
    graph = ir.load(weights_dir / FLOAT_GRAPH) if weights_dir else ir.from_proto(float_model)
    tensors = calibration_tensors(graph, spec)
    gram_keys = gptq_keys(graph, spec)
    key = calibration_key(
        model=checkpoint_digest,
        data=calib_source.digest(),
        # Sampled text depends on what samples it (transformers or llmc's runtime).
        sampler=None if calib_source.path else type(hf_model).__name__,
        samples=calib.calib_samples,
        seq_len=calib.calib_seq_len,
        method=config.calib_method,
        tensors=sorted(tensors),
        gram=sorted(gram_keys),
        llmc=__version__,
    )
    cache = calib.stats_path(key)
    stats = load_stats(cache)
    if stats is None or not set(tensors) <= set(stats):
        with stage("calibration data"):
            windows = windows_of(
                calib_source, hf_model, tokenizer, calib.calib_samples, calib.calib_seq_len
            )
        with stage(f"calibrate ({len(windows)} x {calib.calib_seq_len} tokens)") as tick:
            blocks = -(-calib.calib_seq_len // config.export.block_size)
            runner = OrtRunner.from_model(
                float_model,
                blocks,
                threads=config.target.threads,
                extra_outputs=tuple(dict.fromkeys(tensors.values())),
                external_data_dir=weights_dir,
            )
            stats = collect_stats(runner, tensors, windows, progress=tick, gram_keys=gram_keys)
            del runner
            save_stats(stats, cache)
    with stage(f"quantize ({spec.quant})"):
        report = quantize_graph(graph, stats, spec)
        report.spec["calibration"] = {
            "data": calib_source.describe(),
            "samples": calib.calib_samples,
            "seq_len": calib.calib_seq_len,
            "cache_key": key,
        }
        if weights_dir is None:
            return ir.to_proto(graph), report
    with stage("write the quantized graph"):
        if work_dir is None:
            raise ValueError("a streamed graph is quantized into a work directory")
        path = work_dir / QUANTIZED_GRAPH
        ir.save(graph, path, external_data=QUANTIZED_GRAPH + ".data", max_in_flight_bytes=256 << 20)
        return onnx.load(str(path), load_external_data=False), report


def session_config(quant: str) -> dict[str, str]:
    """ORT session config entries the lowering of a ``quant`` engine needs (its format's)."""
    return dict(FORMATS[quant].ort_session_config)


def rewrite_for_cpu(model: onnx.ModelProto, counts: dict[str, int]) -> dict[str, int]:
    """The CPU rewrite of every format that quantized modules (``counts``, by report label,
    ``QuantReport.counts``), in place; returns the rewrites by format."""
    return {f.name: f.rewrite_for_cpu(model) for f in FORMATS.values() if counts.get(f.label)}


def check_fast_path(quant: str, counts: dict[str, int], optimized_ops: dict[str, int]) -> dict:
    """Compare the fused kernels in the optimized graph with what was quantized (``counts``, by
    report label): each format's modules as its ``cpu_kernel`` (W8A8 int8 as
    MatMulIntegerToFloat, weight-only int4/int8 as MatMulNBits, FP8 as Q/DQ emulation: its
    activation QuantizeLinear nodes remain). Returns {op: {"expected", "found"}}, stored in the
    manifest. Raises FastPathError when ORT did not fuse them all."""
    expected: dict[str, int] = {}
    for f in FORMATS.values():
        if f.cpu_kernel and counts.get(f.label):
            expected[f.cpu_kernel] = expected.get(f.cpu_kernel, 0) + counts[f.label]
    record = {
        op: {"expected": n, "found": int(optimized_ops.get(op, 0))}
        for op, n in sorted(expected.items())
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
    external_data_dir: Path | None = None,
):
    """The engine in ``engine_dir`` against the unquantized graph on held-out windows
    (``llmc.calibration.accuracy.AccuracyReport``); ``external_data_dir`` as in
    ``OrtRunner.from_model``."""
    from llmc.calibration.accuracy import evaluate_accuracy
    from llmc.runtime.ort_runner import OrtRunner

    calib, block_size, threads = config.calibration, config.export.block_size, config.target.threads
    windows = windows_of(source, hf_model, tokenizer, calib.eval_samples, calib.calib_seq_len)
    blocks = -(-calib.calib_seq_len // block_size)
    ref = OrtRunner.from_model(
        reference, blocks, threads=threads, external_data_dir=external_data_dir
    )
    engine = OrtRunner(engine_dir, blocks, threads=threads)
    return evaluate_accuracy(
        ref, engine, windows, block_size, data=source.describe(), progress=progress
    )
