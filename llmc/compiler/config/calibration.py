"""``CalibrationOptions``: the text that calibrates a quantized build and measures its accuracy,
and where calibration statistics are cached."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmc.compiler.config.option import check_at_least, check_choices, option
from llmc.compiler.config.quantization import per_quant
from llmc.errors import BuildConfigError
from llmc.quant.protocol import FormatDefaults

CALIB_METHODS = ("max", "percentile", "mse")


@dataclass(frozen=True)
class CalibrationOptions:
    """Calibration (quantized builds): data, windows, observer, accuracy-report text, cache."""

    calib_data: str | None = option(
        None, ".txt or .jsonl ('text' field); its first 80% calibrates (default: model samples)"
    )
    calib_samples: int = option(64, "calibration windows")
    calib_seq_len: int = option(256, "tokens per calibration window")
    calib_method: str | None = option(
        None,
        "activation range observer: max, percentile (99.99th), mse; default per --quant "
        "--recipe: " + per_quant("calib_method"),
        CALIB_METHODS,
    )
    eval_data: str | None = option(
        None,
        "held-out text for the accuracy report, its last 20% (default: --calib-data's last "
        "20%, else model samples of another seed)",
    )
    eval_samples: int = option(16, "accuracy report windows (of --calib-seq-len tokens)")
    anchor: str = option(
        "auto",
        "auto: score an anchor beside the accuracy report (llama.cpp's Q8_0 of the same weights "
        "for a GGUF checkpoint, else round-to-nearest of the same formats); none: skip it",
        ("auto", "none"),
    )
    cache_dir: str = option("~/.cache/llmc", "where calibration statistics are cached")

    def method_for(self, recipe: FormatDefaults) -> str:
        """The activation range observer: ``--calib-method``, or ``recipe``'s."""
        return self.calib_method or recipe.calib_method

    def stats_path(self, key: str) -> Path:
        """The directory of the cached calibration statistics of cache key ``key``
        (``calibration_key``; ``llmc.calibration.stats_cache.StatsCache``)."""
        return Path(self.cache_dir).expanduser() / "calibration" / key

    def validate(self) -> None:
        """Raise BuildConfigError for an unknown observer, a count below 1 or windows shorter
        than 2 tokens."""
        check_choices(self)
        check_at_least(self, 1, "calib_samples", "calib_seq_len", "eval_samples")
        if self.calib_seq_len < 2:
            raise BuildConfigError("--calib-seq-len must be >= 2")
