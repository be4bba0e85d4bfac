"""The accuracy report of a cpu engine against its unquantized graph on held-out text."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from llmc.compiler.quantize.texts import TextSource, windows_of
from llmc.compiler.weights.stored_weights import segment_widener
from llmc.engine.provider import ProviderChoice
from llmc.heap import release_freed_memory

if TYPE_CHECKING:
    from llmc.compiler.config.build_config import BuildConfig


def accuracy_report(
    config: BuildConfig,
    reference: onnx.ModelProto,
    engine_dir: Path,
    hf_model,
    tokenizer,
    source: TextSource,
    progress,
    external_data_dir: Path | None = None,
    provider: ProviderChoice | None = None,
):
    """The engine in ``engine_dir``, run on ``provider`` (default: the CPU EP), against the
    unquantized graph on held-out windows
    (``llmc.calibration.accuracy.AccuracyReport``). The reference runs one segment at a time
    over every window (``LayerwiseRunner``, its weights read from ``external_data_dir`` for a
    streamed graph) and its logits go to a temporary file there; the engine is loaded after
    the reference is released and scored against them ``LOGITS_ROWS`` positions per
    chunked-prefill step, so the build holds one model and a few rows of logits at a time."""
    import tempfile

    from llmc.calibration.accuracy import check_windows, score_logit_chunks
    from llmc.compiler.quantize.search.assignment_eval import LOGITS_ROWS, spill_logits
    from llmc.runtime.runners.cpu_runner import cpu_runner
    from llmc.runtime.runners.layerwise_runner import LayerwiseRunner

    calib, block_size, threads = config.calibration, config.export.block_size, config.target.threads
    windows = windows_of(source, hf_model, tokenizer, calib.eval_samples, calib.calib_seq_len)
    check_windows(windows)
    ref = LayerwiseRunner(
        reference,
        threads=threads,
        external_data_dir=external_data_dir,
        prepare=segment_widener(external_data_dir),
        logits_rows=LOGITS_ROWS,
    )
    with tempfile.TemporaryFile(dir=external_data_dir) as spill:
        shapes = spill_logits(ref, windows, spill, progress)
        del ref
        release_freed_memory()  # the reference's last segment (vocabulary projection, logits)
        engine = cpu_runner(engine_dir, -(-calib.calib_seq_len // block_size), threads, provider)
        chunks = engine_logit_chunks(engine, windows, shapes, spill, block_size)
        return score_logit_chunks(chunks, windows, source.describe())


def engine_logit_chunks(engine, windows: list[np.ndarray], shapes, spill, block_size: int):
    """Yield ``LogitsChunk``s: ``engine``'s logits of each window, ``LOGITS_ROWS`` positions per
    chunked-prefill step (a 256-token window's whole [T, V] logits are 0.27 GB a copy, several
    in ONNX Runtime), beside the reference's rows mapped from the file ``spill``
    (``spill_logits``' layout, window by window, ``shapes`` its [rows, vocab] per window).
    Raises ValueError when the engine's vocabulary is not the reference's."""
    from llmc.calibration.accuracy import LogitsChunk
    from llmc.compiler.quantize.search.assignment_eval import LOGITS_ROWS
    from llmc.runtime.runners.step_inputs import prefill_chunks

    offset = 0
    for i, (window, (_, vocab)) in enumerate(zip(windows, shapes, strict=True)):
        for step in prefill_chunks(window, block_size, LOGITS_ROWS):
            got = engine.execute(step)
            want = np.memmap(spill, np.float32, "r", offset=offset, shape=got.shape)
            if got.shape[1] != vocab:
                raise ValueError(f"engine vocabulary {got.shape[1]}, reference {vocab}")
            rows = slice(int(step.positions[0]), int(step.positions[-1]) + 1)
            offset += got.size * 4  # float32
            yield LogitsChunk(i, rows, want, got)
            del want, got
