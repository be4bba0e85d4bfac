"""The built engine's own accuracy report checked against ``--accuracy-target``, and what the
build does when it misses: search again further along the upgrade path (``path_search.
Resume``), a bounded number of times, instead of failing.

The search scores the Q/DQ graph; the engine runs fused kernels, a quantized KV cache and its
own attention numerics (bf16 prefill attention on AMX hosts), so its report can land below the
value the search saw. The difference measured at the missed assignment (the engine's loss) is
what the next search keeps on top of the target: an assignment the search scores at least
``target + loss`` is expected to give an engine that keeps ``target``.
"""

from __future__ import annotations

from llmc.compiler.quantize.search.accuracy_target import AccuracyTarget
from llmc.compiler.quantize.search.path_search import AccuracyTargetError, Resume

#: Engines a build may rebuild after the first misses its target.
MAX_RECHECKS = 2


class EngineMissedTarget(AccuracyTargetError):
    """The engine's report missed the target its assignment kept in the search; ``resume``
    says where the search goes on (None when no re-check is left)."""

    def __init__(self, message: str, resume: Resume | None):
        super().__init__(message)
        self.resume = resume


def check_engine_accuracy(
    target: AccuracyTarget | None, accuracy, search_record: dict | None, rechecks_done: int
) -> None:
    """Return when there is no target, no report, or the engine's ``accuracy`` (an
    ``AccuracyReport``) keeps ``target``. Else raise EngineMissedTarget whose ``resume``
    resumes the search (``search_record``: the quantization report's ``accuracy_target``
    record of this engine, ``SearchResult.to_dict``) past this engine's assignment, for the
    target tightened by the largest loss seen; with ``MAX_RECHECKS`` re-checks done, raise it
    with no ``resume`` (the build fails)."""
    if target is None or accuracy is None or target.met(accuracy):
        return
    got = target.measure(accuracy)
    missed = f"the engine's accuracy report gives {target.metric} {got:.4g}, missing {target}"
    if search_record is None:
        raise EngineMissedTarget(missed, None)
    searched = search_record["value"]
    loss = abs(searched - got)
    history = (*search_record.get("rechecks", ()), _missed(search_record, got))
    if rechecks_done >= MAX_RECHECKS:
        raise EngineMissedTarget(
            f"{missed} after {rechecks_done} re-checks further along the upgrade path (the "
            f"search scored {searched:.4g}: the engine's kernels lose {loss:.3g}); relax the "
            "target or build with a stricter --quant",
            None,
        )
    worst = max(abs(m["search_value"] - m["engine_value"]) for m in history)
    resume = Resume(
        search_record["moves"],
        target.tightened(worst),
        search_record["sensitivity_kl"],
        history,
    )
    raise EngineMissedTarget(
        f"{missed} that the search kept at {searched:.4g}; searching past "
        f"{search_record['moves']} moves for {resume.target} (re-check {rechecks_done + 1} of "
        f"{MAX_RECHECKS})",
        resume,
    )


def _missed(record: dict, engine_value: float) -> dict:
    return {"moves": record["moves"], "search_value": record["value"], "engine_value": engine_value}
