"""The accuracy report of an engine against the unquantized model (DESIGN §5).

Both models score the same held-out token windows, one prefill step per window. Three numbers
say how far the engine drifted: perplexity (and its relative change), the mean KL divergence of
the next-token distributions, and how often the most likely next token agrees. KL and top-1
agreement compare the two models with each other and need no good text; perplexity says how well
each predicts the text itself. These are the measures llama.cpp's ``llama-perplexity
--kl-divergence`` and NVIDIA ModelOpt report for quantized models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

import numpy as np

from llmc.plugins.logit_scores import logit_row_sums
from llmc.runtime.runners.step_inputs import single_prefill


@dataclass(frozen=True)
class AccuracyReport:
    """How an engine's next-token predictions compare with the reference (unquantized) model's.

    Attributes:
        data: where the scored text came from (a file path, or "sampled from the model ...").
        num_windows: token windows scored (one prefill step each).
        num_tokens: scored positions: each window of T tokens scores positions 0..T-2, each
            predicting the token after it.
        perplexity_reference: exp(mean next-token negative log-likelihood) of the reference.
        perplexity: the same for the engine.
        perplexity_change: (perplexity - perplexity_reference) / perplexity_reference.
        mean_kl: KL(reference || engine) of the next-token distributions in nats, averaged over
            the scored positions.
        top1_agreement: fraction of scored positions where both models' argmax token agree.
    """

    data: str
    num_windows: int
    num_tokens: int
    perplexity_reference: float
    perplexity: float
    perplexity_change: float
    mean_kl: float
    top1_agreement: float

    def to_dict(self) -> dict:
        """A JSON-ready dict (the manifest's ``accuracy_report``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AccuracyReport:
        """Inverse of ``to_dict``; unknown keys are ignored. Raises ValueError if a field is
        missing or has the wrong type."""
        values = {}
        for f in fields(cls):
            if f.name not in d:
                raise ValueError(f"accuracy report has no {f.name!r}")
            kind = {"str": str, "int": int, "float": float}[str(f.type)]
            value = d[f.name]
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"accuracy report field {f.name!r} is {value!r}")
            try:
                values[f.name] = kind(value)
            except ValueError as e:
                raise ValueError(f"accuracy report field {f.name!r} is {value!r}") from e
        return cls(**values)

    def format(self) -> str:
        """A short human-readable table."""
        return "\n".join(
            [
                f"accuracy against the unquantized model ({self.num_tokens} tokens in "
                f"{self.num_windows} windows)",
                f"  text             {self.data}",
                f"  perplexity       {self.perplexity_reference:.4f} -> {self.perplexity:.4f} "
                f"({self.perplexity_change:+.3%})",
                f"  mean KL          {self.mean_kl:.3g} nats",
                f"  top-1 agreement  {self.top1_agreement:.2%}",
            ]
        )


def evaluate_accuracy(
    reference,
    candidate,
    windows: list[np.ndarray],
    block_size: int,
    data: str,
    progress: Callable[[int, int], None] | None = None,
) -> AccuracyReport:
    """Score ``candidate`` against ``reference`` on ``windows``.

    ``reference`` and ``candidate`` are runners (``llmc.runtime.runners.runner.Runner``, e.g.
    ``OrtRunner``) whose ``execute(step)`` returns logits [S, V] float32; each needs
    ``ceil(max window length / block_size)`` KV blocks. Each window ([T] token ids, T >= 2) runs
    as one prefill step asking for all T positions' logits; positions 0..T-2 are scored against
    the token that follows (``score_logits``). ``progress(done, total)`` is called after each
    window.

    Raises ValueError for no windows, a window shorter than 2 tokens, a runner with too few KV
    blocks, or runners whose vocabularies differ.
    """
    check_windows(windows)
    blocks = -(-max(int(w.shape[0]) for w in windows) // block_size)
    for runner in (reference, candidate):
        if runner.num_blocks < blocks:
            raise ValueError(
                f"a window of {max(int(w.shape[0]) for w in windows)} tokens needs {blocks} KV "
                f"blocks of {block_size}; the runner has {runner.num_blocks}"
            )

    def pairs():
        for window in windows:
            step = single_prefill(window, block_size, all_logits=True)
            yield reference.execute(step), candidate.execute(step)

    return score_logits(pairs(), windows, data, progress)


def check_windows(windows: list[np.ndarray]) -> None:
    """Raise ValueError for no windows or a window shorter than 2 tokens."""
    if not windows:
        raise ValueError("no windows to score")
    for i, window in enumerate(windows):
        if int(window.shape[0]) < 2:
            raise ValueError(
                f"window {i} has {int(window.shape[0])} tokens; scoring needs at least 2"
            )


def score_logits(
    logits: Iterable[tuple[np.ndarray, np.ndarray]],
    windows: list[np.ndarray],
    data: str,
    progress: Callable[[int, int], None] | None = None,
    positions: list[np.ndarray] | None = None,
) -> AccuracyReport:
    """The report from (reference, candidate) logits [T, V] float32 of each window in order
    (all T positions of window i's prefill); positions 0..T-2 are scored against the token
    that follows. With ``positions`` (per window, [L] int64 positions below T - 1), the logits
    are [L, V], those positions' rows, and only they are scored (``_window_sums``). ``data``
    is recorded as the text's origin.
    Raises ValueError as ``score_logit_chunks``."""
    chunks = (LogitsChunk(i, slice(0, None), ref, cand) for i, (ref, cand) in enumerate(logits))
    return score_logit_chunks(chunks, windows, data, progress, positions)


@dataclass(frozen=True)
class LogitsChunk:
    """Some rows of one window's (reference, candidate) logits.

    Attributes:
        window: the window's index.
        rows: which of the window's logits rows these are (a slice of its positions, as
            ``score_logits`` numbers them; ``slice(0, None)``: all).
        reference, candidate: [R, V] float32 logits of those rows.
    """

    window: int
    rows: slice
    reference: np.ndarray
    candidate: np.ndarray


def score_logit_chunks(
    chunks: Iterable[LogitsChunk],
    windows: list[np.ndarray],
    data: str,
    progress: Callable[[int, int], None] | None = None,
    positions: list[np.ndarray] | None = None,
) -> AccuracyReport:
    """The report of all windows of ``score_window_chunks`` (same arguments and errors)."""
    per_window = score_window_chunks(chunks, windows, data, progress, positions)
    return pooled_report(per_window, data)


def pooled_report(reports: list[AccuracyReport], data: str) -> AccuracyReport:
    """One report of disjoint window sets' ``reports`` (of the same text ``data``): negative
    log-likelihoods, KL and agreements weighted by each report's tokens. Raises ValueError for
    no reports."""
    if not reports:
        raise ValueError("no reports to pool")
    tokens = np.array([r.num_tokens for r in reports], np.float64)
    sums = np.array(
        [
            [math.log(r.perplexity_reference), math.log(r.perplexity), r.mean_kl, r.top1_agreement]
            for r in reports
        ]
    )
    return _report(tokens @ sums, int(tokens.sum()), sum(r.num_windows for r in reports), data)


def _report(sums: np.ndarray, num_tokens: int, num_windows: int, data: str) -> AccuracyReport:
    """The report of ``sums`` over ``num_tokens`` scored positions: (reference NLL, candidate
    NLL, KL, top-1 agreements)."""
    nll_ref, nll, kl, agree = sums / num_tokens
    ppl_ref, ppl = math.exp(nll_ref), math.exp(nll)
    return AccuracyReport(
        data=data,
        num_windows=num_windows,
        num_tokens=num_tokens,
        perplexity_reference=ppl_ref,
        perplexity=ppl,
        perplexity_change=(ppl - ppl_ref) / ppl_ref,
        mean_kl=float(kl),
        top1_agreement=float(agree),
    )


def score_window_chunks(
    chunks: Iterable[LogitsChunk],
    windows: list[np.ndarray],
    data: str,
    progress: Callable[[int, int], None] | None = None,
    positions: list[np.ndarray] | None = None,
) -> list[AccuracyReport]:
    """Each window's report (``pooled_report`` makes them one) from windows' logits a few rows
    at a time (a layer-wise run's last segment computes them so, ``LayerwiseRunner``'s
    ``logits_rows``): ``score_logits``'s numbers without any window's [T, V] logits whole in
    memory. ``chunks`` come in window order, each window's rows in order. ``progress(done,
    total)`` counts windows. Raises ValueError as ``check_windows``, when a chunk's two logits
    differ in shape, or when a window has no chunk or its chunks skip or repeat rows."""
    check_windows(windows)
    # per window: reference NLL, candidate NLL, KL, top-1 agreements (sums over rows)
    totals = np.zeros((len(windows), 4))
    num_tokens = np.zeros(len(windows), np.int64)
    current, next_row = -1, 0
    for chunk in chunks:
        i, ref, cand = chunk.window, chunk.reference, chunk.candidate
        if ref.shape != cand.shape:
            raise ValueError(f"logits shapes differ: reference {ref.shape}, engine {cand.shape}")
        if i != current:
            if i != current + 1 or i >= len(windows):
                raise ValueError(f"logits of window {i} after window {current}'s")
            if current >= 0 and progress is not None:
                progress(current + 1, len(windows))
            current, next_row = i, 0
        if (chunk.rows.start or 0) != next_row:
            raise ValueError(f"window {i}'s rows start at {chunk.rows.start}, not {next_row}")
        t = int(windows[i].shape[0])
        scored = np.arange(t - 1) if positions is None else np.asarray(positions[i], np.int64)
        rows = scored[next_row : next_row + ref.shape[0]]
        next_row += ref.shape[0]
        targets = np.asarray(windows[i], dtype=np.int64)[rows + 1]  # [rows]
        n = len(rows)
        totals[i] += _window_sums(ref[:n], cand[:n], targets)
        num_tokens[i] += n
        del ref, cand, chunk  # freed before the next chunk is made
    if current != len(windows) - 1:
        raise ValueError(f"logits of {current + 1} windows for {len(windows)} windows")
    if progress is not None:
        progress(len(windows), len(windows))
    return [_report(totals[i], int(num_tokens[i]), 1, data) for i in range(len(windows))]


def _window_sums(ref: np.ndarray, cand: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Sums over rows of: reference NLL, engine NLL, KL(ref || engine), argmax agreement.

    ref, cand: [N, V] float32 logits; targets: [N] int64, the token each row predicts. The
    rows are scored by ``logit_row_sums`` (one kernel pass set per row, no temporaries; KL in
    its centred form, which keeps float64's value at per-row KL 1e-6)."""
    return logit_row_sums(ref, cand, targets).sum(axis=0)
