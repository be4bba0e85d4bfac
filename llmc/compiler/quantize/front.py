"""The recorded accuracy-versus-speed front of each format's recipes, and the default recipe it
names (``--recipe`` unset).

``front.json`` beside this module holds what ``benchmarks/bench_recipe_front.py`` measured:
per target family (``cpu``; ``gpu`` for every ``sm*`` target), host and model, each recipe's
accuracy report (mean KL, top-1) and speed (S1 decode tok/s and TTFT, S16 total tok/s and mean
TTFT), and for target
families nothing measured yet, the recipe chosen by the arithmetic the hardware runs fastest
(``by_arithmetic``, with the reason).

The rule: within one host and model, a recipe is dominated when another is at least as accurate
(mean KL) and at least as fast in every speed column, and better in one; the recipes no
measurement dominates are the front. The default is the fastest recipe of the front (the
geometric mean of its S1 decode and S16 throughput and the inverses of its S1 and S16 TTFTs
over its measurements: the benchmark measures a format's recipes together, on the same hosts)
among those whose mean KL is within ``KL_SLACK`` times the most accurate one's (KL averaged
over the hosts and models that measured it): accuracy first, speed where the accuracies are of
one class. With no measurement for the family, the
``by_arithmetic`` choice; with neither, the format's first recipe.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

from llmc.quant.protocol import QuantFormat, sm_of

FRONT_FILE = "front.json"
#: The speed columns: throughputs (higher is faster) and times to first token (lower is).
THROUGHPUTS = ("s1_decode_tok_s", "s16_total_tok_s")
TTFTS = ("s1_ttft_ms", "s16_mean_ttft_ms")
#: How many times the most accurate front recipe's mean KL a faster one may have and still be
#: the default (a factor of 2 is about llama.cpp's step from Q8_0 to Q6_K).
KL_SLACK = 2.0


@dataclass(frozen=True)
class Measurement:
    """One recipe measured on one host and model: its engine's accuracy report and speed."""

    family: str  # "cpu" | "gpu"
    host: str
    model: str
    quant: str
    recipe: str
    mean_kl: float
    top1: float
    s1_decode_tok_s: float
    s16_total_tok_s: float
    s1_ttft_ms: float
    s16_mean_ttft_ms: float

    def speeds(self) -> tuple[float, ...]:
        """Every speed column as higher-is-faster: the throughputs, 1000 / each TTFT."""
        ttfts = (1000.0 / getattr(self, t) for t in TTFTS)
        return (*(getattr(self, t) for t in THROUGHPUTS), *ttfts)

    def dominates(self, other: Measurement) -> bool:
        """At least as accurate and as fast as ``other`` in every column, better in one."""
        mine, theirs = (-self.mean_kl, *self.speeds()), (-other.mean_kl, *other.speeds())
        return all(a >= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


@dataclass(frozen=True)
class Front:
    """The recorded front (``front.json``): measurements and the arithmetic choices."""

    measurements: tuple[Measurement, ...]
    by_arithmetic: dict[tuple[str, str], str]  # (family, quant) -> recipe

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Front:
        """Read ``front.json``'s content. Raises KeyError/TypeError for a malformed table."""
        names = Measurement.__dataclass_fields__
        rows = tuple(Measurement(**{k: r[k] for k in names}) for r in data["measurements"])
        chosen = {(r["family"], r["quant"]): r["recipe"] for r in data["by_arithmetic"]}
        return cls(rows, chosen)

    def undominated(self, family: str, quant: str) -> list[str]:
        """The recipes of ``quant`` measured on ``family`` that no measurement of the same host
        and model dominates, in the order first measured."""
        rows = [m for m in self.measurements if (m.family, m.quant) == (family, quant)]
        beaten = {
            m.recipe
            for m in rows
            for o in rows
            if (o.host, o.model) == (m.host, m.model) and o.dominates(m)
        }
        return list(dict.fromkeys(m.recipe for m in rows if m.recipe not in beaten))

    def choose(self, family: str, quant: str) -> str | None:
        """The default recipe of ``quant`` on ``family`` by the rule of this module, None when
        neither a measurement nor an arithmetic choice names one."""
        front = self.undominated(family, quant)
        if not front:
            return self.by_arithmetic.get((family, quant))
        best = min(self.mean_kl(family, quant, r) for r in front)
        close = [r for r in front if self.mean_kl(family, quant, r) <= KL_SLACK * best]
        return max(close, key=lambda r: self.speed(family, quant, r))

    def _rows(self, family: str, quant: str, recipe: str) -> list[Measurement]:
        return [
            m for m in self.measurements if (m.family, m.quant, m.recipe) == (family, quant, recipe)
        ]

    def mean_kl(self, family: str, quant: str, recipe: str) -> float:
        """``recipe``'s mean KL averaged over the hosts and models that measured it."""
        return statistics.fmean(m.mean_kl for m in self._rows(family, quant, recipe))

    def speed(self, family: str, quant: str, recipe: str) -> float:
        """``recipe``'s speed: the geometric mean of its speed columns (``speeds``) over its
        measurements."""
        rows = self._rows(family, quant, recipe)
        return statistics.geometric_mean([v for m in rows for v in m.speeds()])


def family_of(arch: str) -> str:
    """The front's target family of ``arch``: ``cpu``, or ``gpu`` for any ``sm*`` target.
    Raises UnknownTargetError for a name the target registry lacks."""
    return "cpu" if sm_of(arch) is None else "gpu"


def recorded_front() -> Front:
    """The front recorded in the package (``front.json``), read at each call."""
    text = resources.files(__package__).joinpath(FRONT_FILE).read_text()
    return Front.from_dict(json.loads(text))


def default_recipe(fmt: QuantFormat, arch: str, front: Front | None = None) -> str:
    """The recipe of ``fmt`` a build for ``arch`` gets when ``--recipe`` is unset: the
    ``front``'s choice (default: the recorded front) when it names one of the format's
    recipes, else the format's first. Raises UnknownTargetError for an unknown ``arch``."""
    chosen = (front or recorded_front()).choose(family_of(arch), fmt.name)
    names = [r.name for r in fmt.recipe_list()]
    return chosen if chosen in names else names[0]
