"""Where a quantized build's text comes from.

``--calib-data`` gives calibration text (its first 80%); the accuracy report reads held-out text
(the last 20% of ``--eval-data``, else of ``--calib-data``), so the two never overlap. With no
file, both are sampled from the model itself, with different seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llmc.compiler.config.calibration import CalibrationOptions

CALIBRATION_SEED = 0
HELDOUT_SEED = 1


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
