"""The ``--accuracy-target`` search: the cheapest per-layer format assignment whose held-out
accuracy keeps the target.

1. The flat assignment (every unit at ``--quant``'s format, the format's defaults elsewhere)
   is scored on the held-out windows; if it keeps the target, it is the answer.
2. Sensitivity: each unit alone at each of its rungs below float, the rest float, scored by
   the KL divergence of the logits on a few calibration windows (not the held-out ones).
3. The units' moves up their ladders are ordered by KL removed per weight byte added
   (``assignment.upgrade_path``); the assignments after 1, 2, ... moves get cheaper to
   dearer. A binary search over that path (accuracy grows along it, up to noise) finds the
   first one whose held-out accuracy keeps the target, in about log2(moves) scorings, or stops
   once the last miss and the first keep it has seen lie within ``BYTES_TOLERANCE`` of the
   flat assignment's weight bytes, choosing the keep.

Each held-out scoring is screened first (``Screening``): its first ``SCREEN_WINDOWS[0]``
windows, then its first ``SCREEN_WINDOWS[1]``; an assignment whose pooled value there lies more
than ``SCREEN_Z`` standard errors from the target, on either side, is decided without the other
windows. The standard error is that of the mean of the windows scored as an estimate of the
whole set's (their spread over sqrt(n), times the finite-population factor sqrt(1 - n / N):
with every window scored there is no error left). A screened miss costs bytes (the search moves
on past an assignment that would have kept the target); a screened keep that the whole set
would have missed costs an engine re-check (``recheck``): the engine's own accuracy report on
every window decides, never the screening. On the path most scorings are far from the target
(the flat one, the most accurate one, the bisection's first halvings); only those near it take
every window.

The all-float end of the path is not a candidate: a build whose target only float meets fails
(``AccuracyTargetError``) naming the best quantized assignment's accuracy. Scoring is done by
the caller's functions (``assignment_eval``), so this module is plain logic.

When the built engine's own accuracy report misses a target its assignment kept in the search
(the engine's fused kernels, its quantized KV cache and its attention numerics round otherwise
than the scoring), the build searches again (``Resume``): past the assignment it built, for
the target tightened by the engine's shortfall, with the sensitivities already measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from llmc.calibration.accuracy import AccuracyReport, pooled_report
from llmc.compiler.quantize.search.accuracy_target import AccuracyTarget
from llmc.compiler.quantize.search.assignment import FLOAT, Unit, assignment_of, upgrade_path
from llmc.errors import LlmcError

Assignment = tuple[tuple[str, str], ...]
#: Held-out windows a screening scores at each stage, and the standard errors its margin to
#: the target must exceed (n = 4: a t-distribution with 3 degrees of freedom passes 3 about 3%
#: of the time one-sided, before the finite-population factor; a wrong decision costs bytes or
#: a re-check, never the target). Measured on Gemma 3 270M's fp8 -> top1=0.95 path (16 windows
#: of 256 tokens, per-window top-1 spread 0.8-2.3 points): 80 windows scored instead of 112.
SCREEN_WINDOWS = (4, 8)
SCREEN_Z = 3.0
#: The search's last scorings are the dear ones: near the target every held-out window is
#: scored (Gemma 3 270M: ~20 s each), to tell apart assignments a move apart (0.24% of the
#: weight bytes for one layer fp8 -> 8-bit weight-only). It stops when the cheapest keep is
#: known to within this share of the flat assignment's weight bytes: on Gemma 3 270M's fp8 ->
#: top1=0.95 path, 2 such scorings where the exact first keep took 4, for +0.5% of the bytes.
BYTES_TOLERANCE = 0.02


@dataclass(frozen=True)
class Screening:
    """Scoring an assignment's held-out windows a few at a time: ``first(assignment, count)``
    gives one report per window of the set's first ``count`` (windows an earlier call scored
    are not run again, and the full scoring reuses them); the set has ``num_windows``."""

    first: Callable[[Assignment, int], list[AccuracyReport]]
    num_windows: int


class AccuracyTargetError(LlmcError):
    """No quantized assignment keeps ``--accuracy-target`` (or the built engine's own report
    does not)."""


@dataclass(frozen=True)
class Resume:
    """A search resumed after the engine built from ``moves`` moves along the path missed the
    target: only assignments past ``moves`` are candidates, they must keep ``target`` (the
    user's, tightened by the engine's shortfall), and ``sensitivity`` ({unit: {rung: KL}}) is
    the first search's."""

    moves: int
    target: AccuracyTarget
    sensitivity: dict[str, dict[str, float]]
    missed: tuple[dict, ...] = ()  # each missed engine: moves, search_value, engine_value


@dataclass
class SearchResult:
    """What the search chose and what it measured.

    Attributes:
        target: the target searched for.
        rungs: {unit name: the format it takes}.
        assignment: (module, format) pairs of the chosen assignment.
        report: the chosen assignment's held-out accuracy.
        flat: the flat assignment's held-out accuracy.
        weight_bytes: the quantized modules' weight bytes, chosen and flat.
        sensitivity: {unit: {rung: KL}} (empty when the flat assignment kept the target).
        scored: (moves along the path, weight bytes, target metric, windows scored) of each
            held-out scoring (fewer windows: decided by its screening, ``SCREEN_WINDOWS``).
        moves: the chosen assignment's moves along the path (0: flat).
        path_moves: the moves that leave some module quantized (the candidates).
        rechecks: the engines built before this one that missed the target (``Resume``).
    """

    target: AccuracyTarget
    rungs: dict[str, str]
    assignment: Assignment
    report: AccuracyReport
    flat: AccuracyReport
    weight_bytes: tuple[float, float]
    sensitivity: dict[str, dict[str, float]] = field(default_factory=dict)
    scored: list[tuple[int, float, float, int]] = field(default_factory=list)
    moves: int = 0
    path_moves: int = 0
    rechecks: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready (the quantization report's ``spec.accuracy_target``; ``format_record``
        prints it)."""
        return {
            "target": str(self.target),
            "metric": self.target.metric,
            "value": self.target.measure(self.report),
            "flat_value": self.target.measure(self.flat),
            "rungs": self.rungs,
            "report": self.report.to_dict(),
            "flat_report": self.flat.to_dict(),
            "weight_bytes": {"chosen": self.weight_bytes[0], "flat": self.weight_bytes[1]},
            "sensitivity_kl": self.sensitivity,
            "scored": [
                {"moves": k, "weight_bytes": b, "value": v, "windows": n}
                for k, b, v, n in self.scored
            ],
            "moves": self.moves,
            "path_moves": self.path_moves,
            "rechecks": list(self.rechecks),
        }


def format_record(record: dict) -> str:
    """A ``SearchResult.to_dict`` record as a table: each unit's format and its sensitivity (KL
    with it alone at each rung below float)."""
    size = record["weight_bytes"]
    lines = [
        f"--accuracy-target {record['target']}: {record['metric']} {record['value']:.4g} on "
        f"held-out text (flat: {record['flat_value']:.4g}); quantized modules' weights "
        f"{size['chosen'] / 1e6:.1f} MB (flat: {size['flat'] / 1e6:.1f} MB)",
        f"  {'unit':<26} {'format':<17} sensitivity (KL alone at each rung)",
    ]
    for unit, rung in record["rungs"].items():
        kl = record["sensitivity_kl"].get(unit, {})
        shown = "  ".join(f"{r} {v:.3g}" for r, v in kl.items())
        lines.append(f"  {unit:<26} {rung:<17} {shown}")
    return "\n".join(lines)


def search(
    target: AccuracyTarget,
    units: list[Unit],
    float_bytes: float,
    sensitivity_kl: Callable[[list[Assignment]], list[float]],
    heldout: Callable[[Assignment], AccuracyReport],
    progress: Callable[[str], None] | None = None,
    resume: Resume | None = None,
    screen: Screening | None = None,
) -> SearchResult:
    """Search as the module docstring says. ``sensitivity_kl(assignments)`` scores each of
    ``assignments`` on the calibration windows (mean KL), ``heldout(assignment)`` one on the
    held-out ones, ``screen`` a few of those at a time (None: no screening; ``heldout`` may
    reuse them);
    ``progress`` is told each scoring; ``resume`` continues a search past the assignment an
    engine missed with. Raises AccuracyTargetError when no quantized assignment (past
    ``resume.moves``) keeps ``target`` (``resume.target``), ValueError for no units."""
    if not units:
        raise ValueError("no quantized module to assign a format to")
    target = resume.target if resume is not None else target
    say = progress or (lambda _: None)
    flat_rungs = {u.name: u.ladder[0] for u in units}
    flat_bytes = sum(u.weight_bytes(u.ladder[0], float_bytes) for u in units)
    measured = _screened(target, heldout, screen)
    flat = measured(assignment_of(units, flat_rungs))
    scored = [(0, flat_bytes, target.measure(flat), flat.num_windows)]
    say(f"flat assignment: {target.metric} {target.measure(flat):.4g}")
    if resume is None and target.met(flat):
        return SearchResult(
            target, flat_rungs, assignment_of(units, flat_rungs), flat, flat,
            (flat_bytes, flat_bytes), scored=scored,
        )  # fmt: skip
    sensitivity = resume.sensitivity if resume is not None else {}
    sensitivity = sensitivity or _sensitivity(units, sensitivity_kl, say)
    path = upgrade_path(units, sensitivity, float_bytes)
    candidates = path[:-1]  # the last move leaves every unit float
    reports: dict[int, AccuracyReport] = {}

    def score(k: int, expected: float | None = None) -> AccuracyReport:  # after moves 1..k
        if k not in reports:
            move = candidates[k - 1]
            report = reports[k] = measured(assignment_of(units, dict(move.rungs)), expected)
            scored.append((k, move.weight_bytes, target.measure(report), report.num_windows))
            say(f"{k} moves ({move.weight_bytes / 1e6:.1f} MB): {scored[-1][2]:.4g}")
        return reports[k]

    first = 1 if resume is None else resume.moves + 1
    if first > len(candidates):
        raise AccuracyTargetError(
            f"--accuracy-target {target}: the engine of the most accurate assignment that "
            f"quantizes a module ({_describe(candidates)}) missed it; only float keeps it. "
            "Relax the target, or build with --quant none"
        )
    if not target.met(score(len(candidates))):
        best = reports.get(len(candidates), flat)
        raise AccuracyTargetError(
            f"--accuracy-target {target} is not kept by any assignment that quantizes a "
            f"module{_past(resume)}: the most accurate one ({_describe(candidates)}) reaches "
            f"{target.metric} {target.measure(best):.4g}, the flat --quant "
            f"{units[0].ladder[0]} {target.measure(flat):.4g}. Relax the target, or build "
            "with --quant none"
        )
    lo, hi = first, len(candidates)  # hi keeps the target

    def weight_bytes(k: int) -> float:
        return candidates[k - 1].weight_bytes if k else flat_bytes

    tolerance = BYTES_TOLERANCE * flat_bytes
    removed = _kl_removed(candidates)
    while lo < hi and weight_bytes(hi) - weight_bytes(lo - 1) > tolerance:
        mid = (lo + hi) // 2
        expected = _expected_margin(target, reports, flat, mid, (lo, hi), removed)
        if target.met(score(mid, expected)):
            hi = mid
        else:
            lo = mid + 1
    chosen = dict(candidates[hi - 1].rungs)
    return SearchResult(
        target, chosen, assignment_of(units, chosen), reports[hi], flat,
        (candidates[hi - 1].weight_bytes, flat_bytes), sensitivity, scored, hi, len(candidates),
        resume.missed if resume is not None else (),
    )  # fmt: skip


def _kl_removed(moves) -> list[float]:
    """[len(moves) + 1]: the KL the first k moves are expected to remove (the sum of their
    sensitivities' gains, a negative one from noisy sensitivities counted 0), or k itself where
    they remove none."""
    removed = [0.0]
    for move in moves:
        removed.append(removed[-1] + max(0.0, move.kl_removed))
    return removed if removed[-1] > 0 else [float(k) for k in range(len(removed))]


def _expected_margin(target, reports, flat, k: int, bracket, removed) -> float | None:
    """The margin to the target (negative: a miss) expected after ``k`` moves, interpolated
    linearly in the KL the moves are expected to remove (``removed``, ``_kl_removed``: the path
    takes the most KL per byte first, so accuracy rises faster along its first moves) between
    the scored ends of ``bracket`` = (lo, hi): lo - 1 moves (the flat assignment at 0) and hi.
    None where lo - 1 has no score (a resumed search's start)."""
    lo, hi = bracket
    below = flat if lo == 1 else reports.get(lo - 1)
    if below is None:
        return None
    a, b = -target.shortfall(below), -target.shortfall(reports[hi])
    span = removed[hi] - removed[lo - 1]
    share = (removed[k] - removed[lo - 1]) / span if span > 0 else 0.5
    return a + (b - a) * share


def _screened(target: AccuracyTarget, heldout, screen: Screening | None):
    """``heldout``, or where ``screen`` is given, an assignment's screening (its first windows
    pooled) when that decides it (``decision``) at a stage of ``SCREEN_WINDOWS``. A stage that
    could not decide at the margin and spread its previous stage measured is skipped (each
    stage costs the segments' sessions again: a near assignment goes from 4 windows to all);
    before its first stage, an assignment's margin is the one expected of it (``measured``'s
    second argument: between its bisection bracket's ends) and its spread the one the last
    screening measured, so a scoring expected near the target takes every window at once."""
    if screen is None:
        return lambda assignment, expected=None: heldout(assignment)
    last_spread: list[float] = []  # the per-window spread of the last stage run

    def measured(assignment: Assignment, expected: float | None = None) -> AccuracyReport:
        seen = None if expected is None or not last_spread else (expected, last_spread[-1])
        for count in SCREEN_WINDOWS:  # seen: (margin, spread) of the last stage
            if count >= screen.num_windows:
                break
            if seen is not None and abs(seen[0]) <= _bound(seen[1], count, screen.num_windows):
                continue
            part = screen.first(assignment, count)
            if decision(target, part, screen.num_windows) is not None:
                return pooled_report(part, part[0].data)
            seen = _margin_and_spread(target, part)
            last_spread.append(seen[1])
        return heldout(assignment)

    return measured


def decision(
    target: AccuracyTarget, per_window: list[AccuracyReport], num_windows: int
) -> bool | None:
    """Whether the whole set of ``num_windows`` windows keeps ``target`` (True) or misses it
    (False), as far as ``per_window`` (one report per window, the set's first) tells: their
    pooled value lies more than ``SCREEN_Z`` standard errors of the set's mean from the target
    (the windows' spread over sqrt(n), times sqrt(1 - n / num_windows)). None: undecided, or
    fewer than 2 windows."""
    if len(per_window) < 2:
        return None
    margin, spread = _margin_and_spread(target, per_window)
    if abs(margin) <= _bound(spread, len(per_window), num_windows):
        return None
    return margin > 0


def _margin_and_spread(target: AccuracyTarget, per_window: list[AccuracyReport]):
    """(how far the pooled value keeps the target, negative when it misses; the per-window
    values' standard deviation), from at least 2 windows."""
    values = [target.measure(r) for r in per_window]
    margin = -target.shortfall(pooled_report(per_window, per_window[0].data))
    return margin, statistics.stdev(values)


def _bound(spread: float, n: int, num_windows: int) -> float:
    """``SCREEN_Z`` standard errors of the mean of ``n`` of ``num_windows`` windows."""
    return SCREEN_Z * spread / math.sqrt(n) * math.sqrt(max(0.0, 1 - n / num_windows))


def _sensitivity(units: list[Unit], sensitivity_kl, say) -> dict[str, dict[str, float]]:
    """{unit: {rung: KL}}: each unit alone at each rung below float, the rest float, scored in
    one call (``sensitivity_kl`` may share the float segments among them)."""
    all_float = {u.name: FLOAT for u in units}
    pairs = [(u, rung) for u in units for rung in u.ladder[:-1]]
    kls = sensitivity_kl([assignment_of(units, all_float | {u.name: r}) for u, r in pairs])
    sensitivity: dict[str, dict[str, float]] = {}
    for (u, rung), kl in zip(pairs, kls, strict=True):
        sensitivity.setdefault(u.name, {})[rung] = kl
        say(f"sensitivity {u.name} {rung}: KL {kl:.4g}")
    return sensitivity


def _past(resume: Resume | None) -> str:
    if resume is None:
        return ""
    return f" past the {resume.moves} moves whose engine missed it"


def _describe(candidates) -> str:
    if not candidates:
        return "none: the ladder has no rung between the format and float"
    last = candidates[-1]
    quantized = [u for u, r in last.rungs.items() if r != FLOAT]
    return f"only {', '.join(quantized)} quantized"
