"""``--accuracy-target METRIC=VALUE``: the accuracy an engine must keep against the unquantized
model, in one of the accuracy report's measures (``llmc.calibration.accuracy``):

- ``top1=0.95``: top-1 agreement of the next-token argmax at least 0.95;
- ``kl=0.01``: mean KL(reference || engine) of the next-token distributions at most 0.01 nats;
- ``ppl_change=0.02``: perplexity at most 2% above the reference's.

The same measures as NVIDIA Model Optimizer's AutoQuantize constraints and llama.cpp's
``llama-perplexity --kl-divergence`` report.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc.errors import BuildConfigError

#: metric -> (the accuracy report's field, True when larger is better)
METRICS: dict[str, tuple[str, bool]] = {
    "top1": ("top1_agreement", True),
    "kl": ("mean_kl", False),
    "ppl_change": ("perplexity_change", False),
}


@dataclass(frozen=True)
class AccuracyTarget:
    """One bound on one metric of an ``AccuracyReport`` (see the module docstring)."""

    metric: str  # a key of METRICS
    value: float

    @classmethod
    def parse(cls, text: str) -> AccuracyTarget:
        """``"top1=0.95"`` -> AccuracyTarget("top1", 0.95). Raises BuildConfigError for an
        unknown metric, a value that is not a number, or one no engine can reach (top-1
        outside (0, 1], a KL or perplexity change below 0)."""
        metric, sep, raw = text.partition("=")
        metric = metric.strip().replace("-", "_")
        if not sep or metric not in METRICS:
            raise BuildConfigError(
                f"--accuracy-target takes METRIC=VALUE with METRIC one of {', '.join(METRICS)} "
                f"(e.g. top1=0.95), got {text!r}"
            )
        try:
            value = float(raw)
        except ValueError:
            raise BuildConfigError(
                f"--accuracy-target {metric}= needs a number, got {raw!r}"
            ) from None
        if metric == "top1" and not 0.0 < value <= 1.0:
            raise BuildConfigError(f"--accuracy-target top1 is a fraction in (0, 1], got {value}")
        if metric != "top1" and value < 0.0:
            raise BuildConfigError(f"--accuracy-target {metric} cannot be negative, got {value}")
        return cls(metric, value)

    def measure(self, report) -> float:
        """This target's metric read from ``report`` (an ``AccuracyReport``)."""
        return float(getattr(report, METRICS[self.metric][0]))

    def met(self, report) -> bool:
        """Whether ``report`` (an ``AccuracyReport``) keeps this target."""
        higher_is_better = METRICS[self.metric][1]
        got = self.measure(report)
        return got >= self.value if higher_is_better else got <= self.value

    def shortfall(self, report) -> float:
        """How far ``report`` misses this target in its metric (<= 0 when it keeps it)."""
        got = self.measure(report)
        return self.value - got if METRICS[self.metric][1] else got - self.value

    def tightened(self, by: float) -> AccuracyTarget:
        """This target made stricter by ``by`` (>= 0) in its metric: top-1 raised (at most
        1), a KL or perplexity change lowered (at least 0)."""
        if METRICS[self.metric][1]:
            return AccuracyTarget(self.metric, min(1.0, self.value + by))
        return AccuracyTarget(self.metric, max(0.0, self.value - by))

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if METRICS[self.metric][1] else '<='} {self.value:g}"
