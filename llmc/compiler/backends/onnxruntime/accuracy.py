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
    the reference is released and scored window by window against them, so the build holds
    one model at a time."""
    import tempfile

    from llmc.calibration.accuracy import check_windows, score_logits
    from llmc.compiler.quantize.search.assignment_eval import LOGITS_ROWS, spill_logits
    from llmc.runtime.runners.cpu_runner import cpu_runner
    from llmc.runtime.runners.layerwise_runner import LayerwiseRunner
    from llmc.runtime.runners.step_inputs import single_prefill

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

        def pairs():
            spill.seek(0)
            for window, shape in zip(windows, shapes, strict=True):
                want = np.fromfile(spill, np.float32, shape[0] * shape[1]).reshape(shape)
                yield want, engine.execute(single_prefill(window, block_size, all_logits=True))

        return score_logits(pairs(), windows, source.describe())
