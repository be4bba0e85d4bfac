"""Per-layer format assignments for ``--accuracy-target``: the units a search moves, their
ladders of formats, the weight bytes of an assignment, and the order in which units leave the
cheap format.

A unit is one decoder layer (every quantized module under ``...layers.<i>.``) or one module
outside the layers (the vocabulary projection ``lm_head``). Its ladder is ``--quant``'s format,
then the format's ``fallbacks`` (e.g. fp8 -> 8-bit weight-only), then float ("none"), cheapest
first; a module whose default is already further up the ladder (``--weight-only8 lm_head``)
starts there. Modules ``--exclude`` keeps float are in no unit.

The order (``upgrade_path``) is the greedy of NVIDIA Model Optimizer's AutoQuantize and of
mixed-precision searches in general (HAWQ, "HAWQ-V3", Yao et al. 2021, §3.3): each unit's
sensitivity at each rung (the KL divergence of the logits when that unit alone takes that
format, the rest float) is taken as additive; from the all-cheapest assignment, the move of
one unit to a higher rung with the largest KL removed per weight byte added is taken next.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from llmc.compiler.quantize.formats import FORMATS

FLOAT = "none"
_LAYER = re.compile(r"^(.*?layers\.\d+)\.")


@dataclass(frozen=True)
class Unit:
    """Modules that take one format together.

    Attributes:
        name: the decoder layer's prefix (``model.layers.3``) or the module's name.
        modules: {module name: parameters (K x N)}.
        starts: {module name: its default format (``qdq.base_format``)}.
        ladder: format names the unit may take, cheapest first, ending with "none".
    """

    name: str
    modules: Mapping[str, int]
    starts: Mapping[str, str]
    ladder: tuple[str, ...]

    def formats(self, rung: str) -> dict[str, str]:
        """Each module's format when the unit takes ``rung``: ``rung``, or the module's own
        default where that is further up the ladder."""
        top = self.ladder.index(rung)
        return {m: self.ladder[max(top, self.ladder.index(s))] for m, s in self.starts.items()}

    def weight_bytes(self, rung: str, float_bytes: float) -> float:
        """Bytes of the unit's weights at ``rung`` (scales included; float at ``float_bytes``
        per weight)."""
        return sum(
            self.modules[m] * (float_bytes if f == FLOAT else FORMATS[f].weight_bytes)
            for m, f in self.formats(rung).items()
        )


def ladder_of(quant: str) -> tuple[str, ...]:
    """``quant``, its fallbacks, then "none" (cheapest first)."""
    return (quant, *FORMATS[quant].fallbacks, FLOAT)


def unit_name(module: str) -> str:
    """The unit of ``module``: its decoder layer's prefix, else the module itself."""
    match = _LAYER.match(module)
    return match.group(1) if match else module


def make_units(
    modules: Mapping[str, int], starts: Mapping[str, str], ladder: tuple[str, ...]
) -> list[Unit]:
    """Group ``modules`` ({name: parameters}, in graph order; the ones quantized by default)
    into units over ``ladder``; ``starts`` gives each module's default format (one of
    ``ladder``). Raises ValueError for a default not on the ladder."""
    grouped: dict[str, dict[str, int]] = {}
    for module, params in modules.items():
        grouped.setdefault(unit_name(module), {})[module] = params
    units = []
    for name, members in grouped.items():
        unit_starts = {m: starts[m] for m in members}
        bad = [s for s in unit_starts.values() if s not in ladder]
        if bad:
            raise ValueError(f"format {bad[0]!r} of unit {name} is not on the ladder {ladder}")
        first = min(ladder.index(s) for s in unit_starts.values())
        units.append(Unit(name, members, unit_starts, ladder[first:]))
    return units


def assignment_of(units: list[Unit], rungs: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The (module, format) pairs of ``units`` at ``rungs`` ({unit name: rung}), sorted."""
    pairs = {}
    for unit in units:
        pairs.update(unit.formats(rungs[unit.name]))
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class Move:
    """One step of ``upgrade_path``: ``unit`` from ``old`` to ``new``; ``rungs`` after it, the
    assignment's weight bytes and the sensitivity it is expected to remove."""

    unit: str
    old: str
    new: str
    rungs: Mapping[str, str]
    weight_bytes: float
    kl_removed: float


def upgrade_path(
    units: list[Unit], sensitivity: Mapping[str, Mapping[str, float]], float_bytes: float
) -> list[Move]:
    """Moves from every unit at its cheapest rung to every unit float, best first (module
    docstring). ``sensitivity[unit][rung]``: the KL with that unit alone at that rung (float
    rungs count 0). A move may skip rungs (fp8 -> float when 8-bit weight-only gains little);
    ties go to the larger KL removed, then to the earlier unit."""
    rungs = {u.name: u.ladder[0] for u in units}
    cost = {
        (u.name, r): u.weight_bytes(r, float_bytes) for u in units for r in u.ladder
    }  # fmt: skip
    total = sum(cost[(u.name, rungs[u.name])] for u in units)

    def kl(unit: str, rung: str) -> float:
        return 0.0 if rung == FLOAT else float(sensitivity[unit][rung])

    path = []
    while True:
        best = None
        for u in units:
            now = rungs[u.name]
            for rung in u.ladder[u.ladder.index(now) + 1 :]:
                gain = kl(u.name, now) - kl(u.name, rung)
                added = max(cost[(u.name, rung)] - cost[(u.name, now)], 1.0)
                key = (gain / added, gain)
                if best is None or key > best[0]:
                    best = (key, u.name, now, rung, added)
        if best is None:
            return path
        (_, gain), name, old, new, added = best
        rungs[name] = new
        total += cost[(name, new)] - cost[(name, old)]
        path.append(Move(name, old, new, dict(rungs), total, gain))
