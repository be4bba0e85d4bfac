"""Which tokens of which requests run in the next step (after vLLM v1's scheduler).

Pure Python: the scheduler moves `Sequence`s between queues and hands out KV blocks; it never
touches a tensor. It is tested with fake model outputs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, fields

from llmc.errors import EngineConfigError
from llmc.runtime.block_pool import BlockPool
from llmc.runtime.sequence import Sequence, SequenceStatus
from llmc.runtime.stats import EngineStats


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the scheduler.

    Attributes:
        max_model_len: longest sequence (prompt + output) in tokens.
        block_size: tokens per KV block.
        num_blocks: blocks in the KV cache.
        max_num_seqs: most requests running at once (in one step).
        max_num_batched_tokens: token budget of one step (T, the packed tokens).

    Raises:
        ValueError: if a limit is < 1, or if the cache cannot hold one sequence of
            ``max_model_len`` tokens (such a request could never finish).
    """

    max_model_len: int
    block_size: int
    num_blocks: int
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool) and value < 1:
                raise EngineConfigError(f"{f.name} must be >= 1, got {value}")
        capacity = self.num_blocks * self.block_size
        if capacity < self.max_model_len:
            raise EngineConfigError(
                f"the KV cache holds {capacity} tokens ({self.num_blocks} blocks of "
                f"{self.block_size}) but max_model_len is {self.max_model_len}; one sequence of "
                "max_model_len tokens must fit: lower max_model_len (--max-model-len) or give "
                "the cache more blocks (--kv-cache-memory, --num-blocks)"
            )


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence's share of a step.

    Attributes:
        seq: the request.
        num_computed_tokens: tokens already in the cache before this step (the first new token's
            position).
        num_new_tokens: tokens computed in this step (a prompt chunk, a recomputation, or the one
            token sampled last step).
        samples: whether this step reaches the end of the sequence, so a token is sampled.
    """

    seq: Sequence
    num_computed_tokens: int
    num_new_tokens: int
    samples: bool


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan of one step. Valid until `Scheduler.update_from_output` is called with it.

    Attributes:
        scheduled: sequences in step order (running ones first, then newly admitted ones).
        preempted_request_ids: requests preempted (sent back to waiting) while planning this step.
        num_batched_tokens: T, the sum of ``num_new_tokens``.
    """

    scheduled: tuple[ScheduledSequence, ...]
    preempted_request_ids: tuple[str, ...]
    num_batched_tokens: int

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences that sample this step, in the order of the logits rows."""
        return [s.seq for s in self.scheduled if s.samples]


class Scheduler:
    """FCFS continuous-batching scheduler with chunked prefill and preemption by recompute.

    Args:
        config: the limits.
        eos_token_ids: token ids that end a request unless it sets ``ignore_eos``.
    """

    def __init__(self, config: SchedulerConfig, eos_token_ids: Iterable[int]) -> None:
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_pool = BlockPool(config.num_blocks)
        # Aborted requests stay in `waiting` until they reach its front (no O(n) removal).
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order; at most max_num_seqs
        self.requests: dict[str, Sequence] = {}  # every unfinished request
        self.num_preemptions = 0

    @property
    def num_running_seqs(self) -> int:
        return len(self.running)

    @property
    def num_waiting_seqs(self) -> int:
        return len(self.requests) - len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        """The queues, the pool's usage and the cumulative counters (see `EngineStats`)."""
        pool = self.block_pool
        return EngineStats(
            num_running=self.num_running_seqs,
            num_waiting=self.num_waiting_seqs,
            kv_cache_usage=pool.usage,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=self.num_preemptions,
            num_free_blocks=pool.num_free_blocks,
            num_total_blocks=pool.num_blocks,
        )

    def add_request(self, seq: Sequence) -> None:
        """Queue a new request at the back of the waiting queue.

        The caller (the engine) has validated it: ``num_prompt_tokens + max_tokens`` is at most
        ``max_model_len``.

        Raises:
            ValueError: if an unfinished request has the same id.
        """
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        seq.status = SequenceStatus.WAITING
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        """Plan the next step.

        Algorithm (vLLM v1): there is no prefill phase and no decode phase. Every request has
        ``num_tokens`` (prompt + output so far) and ``num_computed_tokens`` (those in the KV
        cache); a step gives it ``num_new_tokens = num_tokens - num_computed_tokens``, cut to what
        is left of the step's token budget (``max_num_batched_tokens``). One rule covers a whole
        prompt, a chunk of a long prompt (chunked prefill), the recomputation of a preempted
        request and a decode (one new token).

        1. Running requests first, in admission order. Each gets the blocks its new tokens need.
           When the pool runs dry, the most recently admitted running request is preempted: its
           blocks are freed, its ``num_computed_tokens`` reset to 0, and it goes back to the front
           of the waiting queue (to be recomputed later). This repeats until the allocation
           succeeds or the request has preempted itself.
        2. Then, unless something was preempted, waiting requests are admitted in FCFS order while
           budget, ``max_num_seqs`` and blocks last. The first one that does not fit stops
           admission: no later request overtakes it.

        A sequence samples when its computed tokens reach its full length.
        """
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted: list[str] = []

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new, preempted):
                break  # seq preempted itself, so every request after it was preempted too
            scheduled.append(self._plan(seq, num_new))
            budget -= num_new
            i += 1

        while not preempted and self.waiting and budget > 0:
            seq = self.waiting[0]
            if seq.is_finished:  # aborted while waiting
                self.waiting.popleft()
                continue
            if len(self.running) >= self.config.max_num_seqs:
                break
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate(seq, num_new):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(self._plan(seq, num_new))
            budget -= num_new

        return SchedulerOutput(
            scheduled=tuple(scheduled),
            preempted_request_ids=tuple(preempted),
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
        )

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: Iterable[int]
    ) -> list[Sequence]:
        """Record a step's results: computed tokens, sampled tokens, and stop conditions.

        Stops on EOS (unless ``ignore_eos``), a stop token id, ``max_tokens`` or
        ``max_model_len``; a finished request's blocks are freed at once. Stop *strings* are the
        detokenizer's business: the engine reports them through `finish_request`.

        Args:
            scheduler_output: the plan the step ran.
            sampled_token_ids: [S] one token per entry of ``scheduler_output.sampling``, in order.

        Returns:
            The sequences that received a token, in step order; finished ones have their
            FINISHED_* status. Requests aborted while the step ran are left out.

        Raises:
            ValueError: if the number of sampled tokens is not S.
        """
        sampled = [int(t) for t in sampled_token_ids]
        num_sampling = sum(s.samples for s in scheduler_output.scheduled)
        if len(sampled) != num_sampling:
            raise ValueError(f"expected {num_sampling} sampled tokens, got {len(sampled)}")
        tokens = iter(sampled)
        updated = []
        for planned in scheduler_output.scheduled:
            seq = planned.seq
            token = next(tokens) if planned.samples else None
            if seq.is_finished:
                continue
            seq.num_computed_tokens = planned.num_computed_tokens + planned.num_new_tokens
            if token is None:
                continue
            seq.append_token(token)
            updated.append(seq)
            status = self._check_stop(seq)
            if status is not None:
                self._finish(seq, status)
        return updated

    def finish_request(self, request_id: str, status: SequenceStatus) -> None:
        """End a request from outside (a stop string, an abort) and free its blocks.

        Unknown or already finished ids are ignored: an abort may race with the request's end.

        Raises:
            ValueError: if ``status`` is not a FINISHED_* status.
        """
        if not status.is_finished:
            raise ValueError(f"finish_request needs a FINISHED_* status, got {status.name}")
        seq = self.requests.get(request_id)
        if seq is not None:
            self._finish(seq, status)

    def abort_request(self, request_id: str) -> None:
        """Cancel a request wherever it is; unknown or finished ids are ignored."""
        self.finish_request(request_id, SequenceStatus.FINISHED_ABORTED)

    def _plan(self, seq: Sequence, num_new: int) -> ScheduledSequence:
        reaches_end = seq.num_computed_tokens + num_new == seq.num_tokens
        return ScheduledSequence(seq, seq.num_computed_tokens, num_new, reaches_end)

    def _allocate(self, seq: Sequence, num_new: int) -> bool:
        """Give ``seq`` the blocks for ``num_new`` more tokens; False if the pool is short."""
        total = seq.num_computed_tokens + num_new
        needed = -(-total // self.config.block_size) - len(seq.block_ids)
        if needed <= 0:
            return True
        if not self.block_pool.can_allocate(needed):
            return False
        seq.block_ids.extend(self.block_pool.allocate(needed))
        return True

    def _allocate_or_preempt(self, seq: Sequence, num_new: int, preempted: list[str]) -> bool:
        """Allocate for ``seq``, preempting the newest running requests as needed.

        Returns False when ``seq`` itself had to be preempted.
        """
        while not self._allocate(seq, num_new):
            victim = self.running.pop()
            self._free_blocks(victim)
            victim.num_computed_tokens = 0
            victim.status = SequenceStatus.WAITING
            self.waiting.appendleft(victim)
            preempted.append(victim.request_id)
            self.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def _check_stop(self, seq: Sequence) -> SequenceStatus | None:
        params = seq.params
        last = seq.output_token_ids[-1]
        if (not params.ignore_eos and last in self.eos_token_ids) or last in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED
        if (
            seq.num_output_tokens >= params.max_tokens
            or seq.num_tokens >= self.config.max_model_len
        ):
            return SequenceStatus.FINISHED_LENGTH_CAPPED
        return None

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)  # O(max_num_seqs), a small bound
        seq.status = status
        self._free_blocks(seq)
        del self.requests[seq.request_id]

    def _free_blocks(self, seq: Sequence) -> None:
        # Tail blocks first: they go to the front of the eviction order (see BlockPool.free).
        self.block_pool.free(reversed(seq.block_ids))
        seq.block_ids = []
