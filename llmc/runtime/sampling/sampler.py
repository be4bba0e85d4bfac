"""Pick the next token of each sampling sequence from its logits (vLLM v1's sampler order)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from llmc.runtime.sampling.categorical import sample_categorical
from llmc.runtime.sampling.penalties import apply_min_tokens, apply_penalties
from llmc.runtime.sampling.stop_checker import below_min_tokens
from llmc.runtime.sampling_params import SamplingParams, check_seed
from llmc.runtime.sequence import Sequence
from llmc.runtime.structured.grammar import apply_token_masks

if TYPE_CHECKING:
    import torch


class Sampler:
    """Greedy, temperature, min-p, top-k and top-p sampling over a batch of logits rows.

    First the processors that depend on a row's tokens (`penalties`): ``min_tokens`` masks the
    stop tokens, then the repetition, frequency and presence penalties, then a constrained
    row's grammar masks the tokens it does not allow (``grammar.py``). Greedy rows (temperature
    0) then take one batched argmax. The other rows are scaled by their temperature, masked by
    min-p (Nguyen et al. 2024: probabilities below ``min_p`` times the largest), by top-k (a
    ``topk`` threshold, no sort) and/or top-p (Holtzman et al. 2019, "The Curious Case of Neural
    Text Degeneration": keep the smallest set of most likely tokens whose mass reaches ``top_p``;
    needs a sort, done only for rows that set top_p < 1), then sampled by inverse transform
    (``categorical.sample_categorical``): one float64 uniform per row, which each row draws
    from its own generator, found in the row's cumulative probabilities (vLLM's exponential
    race draws V numbers per row; on a CPU that cost about a model step at V = 262,144).

    How a row is processed depends only on its own parameters and tokens, and a seeded row draws
    its noise from its own generator, so a request with a seed gets the same tokens whatever it
    is batched with.

    Seeds are unsigned 64-bit (`check_seed`). torch's CPU generator (mt19937) keeps only the
    low 32 bits of a seed, so seeds that differ only above bit 31 give the same samples.

    Args:
        seed: seed of the generator shared by rows without their own, in [0, 2**64 - 1]; None
            seeds it from the operating system's entropy.
        eos_token_ids: the model's EOS ids, masked while a row is below its ``min_tokens``.

    Raises:
        ValueError: if ``seed`` is not None or an integer in [0, 2**64 - 1].
    """

    def __init__(self, seed: int | None = None, eos_token_ids: Iterable[int] = ()) -> None:
        import torch

        if seed is not None:
            check_seed(seed)
        self.eos_token_ids = frozenset(eos_token_ids)
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    def __call__(
        self, logits: np.ndarray, seqs: list[Sequence], in_place: bool = False
    ) -> np.ndarray:
        """Sample one token per row.

        Args:
            logits: [S, V] float32, one row per sampling sequence; not modified unless
                ``in_place``.
            seqs: the S rows' sequences (parameters, tokens so far, own generator).
            in_place: the caller reads ``logits`` no more: the processors (penalties, grammar
                masks) write into it instead of a copy (16 MB per step at S = 16, V = 262,144).

        Returns:
            [S] int64 token ids.

        Raises:
            ValueError: if ``seqs`` does not have S entries.
        """
        num_rows = logits.shape[0]
        if len(seqs) != num_rows:
            raise ValueError(f"{num_rows} logits rows but {len(seqs)} sequences")
        params = [seq.params for seq in seqs]
        generators = [seq.generator for seq in seqs]
        if any(
            below_min_tokens(s) or s.params.has_penalties or s.grammar is not None for s in seqs
        ):
            logits = logits if in_place else logits.copy()
            apply_min_tokens(logits, seqs, self.eos_token_ids)
            apply_penalties(logits, seqs)
            apply_token_masks(logits, seqs)  # structured outputs: what the grammar allows
        greedy = np.fromiter((p.is_greedy for p in params), np.bool_, num_rows)
        if greedy.all():
            return logits.argmax(axis=1).astype(np.int64)
        token_ids = np.empty(num_rows, np.int64)
        if greedy.any():
            token_ids[greedy] = logits[greedy].argmax(axis=1)
        rows = np.flatnonzero(~greedy)
        token_ids[rows] = self._sample_random(
            logits[rows], [params[i] for i in rows], [generators[i] for i in rows]
        )
        return token_ids

    @property
    def generator(self) -> torch.Generator:
        """The generator of rows whose request has no seed of its own."""
        return self._generator

    def _sample_random(
        self,
        logits: np.ndarray,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> np.ndarray:
        """logits: [R, V], a private copy (modified in place). Returns [R] int64."""
        probs = self.probabilities(logits, params)
        return sample_categorical(probs.numpy(), self._uniforms(generators))

    def _uniforms(self, generators: list[torch.Generator | None]) -> np.ndarray:
        """[R] float64 in [0, 1): row i's from ``generators[i]``, or from the shared generator
        (in row order) where that is None."""
        import torch

        uniforms = np.empty(len(generators), np.float64)
        shared = [i for i, g in enumerate(generators) if g is None]
        if shared:
            draws = torch.rand(len(shared), generator=self._generator, dtype=torch.float64)
            uniforms[shared] = draws.numpy()
        for i, g in enumerate(generators):
            if g is not None:
                uniforms[i] = torch.rand(1, generator=g, dtype=torch.float64).item()
        return uniforms

    @staticmethod
    def probabilities(logits: np.ndarray, params: list[SamplingParams]) -> torch.Tensor:
        """The distribution each row samples from: [R, V] float32 probabilities of ``logits``
        ([R, V], modified in place) scaled by the row's temperature (> 0) and masked by its
        min-p, top-k and top-p, in that order (the class docstring)."""
        import torch

        x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))  # x: [R, V]
        num_rows, vocab_size = x.shape
        x.div_(torch.tensor([p.temperature for p in params], dtype=torch.float32)[:, None])
        min_p_rows = [i for i, p in enumerate(params) if p.min_p > 0.0]
        if min_p_rows:
            idx = torch.tensor(min_p_rows)
            min_p = torch.tensor([params[i].min_p for i in min_p_rows], dtype=torch.float32)
            x[idx] = _min_p_mask(x[idx], min_p)

        top_k = [min(p.top_k, vocab_size) if p.top_k is not None else None for p in params]
        nucleus_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
        top_k_rows = [i for i, k in enumerate(top_k) if k is not None and params[i].top_p >= 1.0]
        if top_k_rows:
            idx = torch.tensor(top_k_rows)
            x[idx] = _top_k_mask(x[idx], torch.tensor([top_k[i] for i in top_k_rows]))
        if nucleus_rows:
            idx = torch.tensor(nucleus_rows)
            k = torch.tensor([top_k[i] or vocab_size for i in nucleus_rows])
            p = torch.tensor([params[i].top_p for i in nucleus_rows], dtype=torch.float32)
            x[idx] = _top_k_top_p_mask(x[idx], k, p)

        return x.softmax(dim=-1)


def _min_p_mask(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """x: [R, V], min_p: [R] in (0, 1]. Sets to -inf the logits whose probability is below
    ``min_p`` times the row's largest (vLLM's ``MinPLogitsProcessor``)."""
    import torch

    probs = x.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return x.masked_fill(probs < threshold, -torch.inf)


def _top_k_mask(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x: [R, V], k: [R] in [1, V]. Sets logits below each row's k-th largest to -inf.

    Ties with the k-th value are kept (as in vLLM). One ``topk`` of width max(k), no full sort.
    """
    import torch

    kth = x.topk(int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])  # kth: [R, 1]
    return x.masked_fill(x < kth, -torch.inf)


def _top_k_top_p_mask(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """x: [R, V], k: [R] in [1, V], p: [R] in (0, 1]. Masks to -inf all but the nucleus.

    After vLLM's ``apply_top_k_top_p``: sort each row ascending, drop all but the last k, then drop
    the low tail whose cumulative probability is at most 1 - p; the most likely token always
    stays.
    """
    import torch

    x_sorted, order = x.sort(dim=-1)  # ascending: x_sorted: [R, V]
    vocab_size = x.shape[1]
    ranks = torch.arange(vocab_size)[None, :]
    x_sorted.masked_fill_(ranks < (vocab_size - k)[:, None], -torch.inf)
    tail_mass = x_sorted.softmax(dim=-1).cumsum(dim=-1)
    drop = tail_mass <= (1.0 - p)[:, None]
    drop[:, -1] = False
    x_sorted.masked_fill_(drop, -torch.inf)
    return torch.empty_like(x).scatter_(-1, order, x_sorted)
