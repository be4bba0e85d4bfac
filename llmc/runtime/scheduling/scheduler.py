"""Which tokens of which requests run in the next step (after vLLM v1's scheduler).

Pure Python: the scheduler moves `Sequence`s between queues and asks the `KVCacheManager` for
blocks; it never touches a tensor. It is tested with fake model outputs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from llmc.runtime.sampling.stop_checker import StopChecker
from llmc.runtime.scheduling.block_pool import BlockPool
from llmc.runtime.scheduling.kv_cache_manager import KVCacheManager
from llmc.runtime.scheduling.scheduler_config import SchedulerConfig
from llmc.runtime.scheduling.scheduler_output import ScheduledSequence, SchedulerOutput
from llmc.runtime.scheduling.waiting_queue import WaitingQueue
from llmc.runtime.sequence import Sequence, SequenceStatus
from llmc.runtime.stats import EngineStats

__all__ = ["ScheduledSequence", "Scheduler", "SchedulerConfig", "SchedulerOutput"]


class Scheduler:
    """FCFS continuous-batching scheduler: chunked prefill, prefix caching, preemption by
    recompute, n > 1 completions forked after the prompt and capped to a share of the slots.

    Args:
        config: the limits.
        eos_token_ids: token ids that end a request unless it sets ``ignore_eos``.
    """

    def __init__(self, config: SchedulerConfig, eos_token_ids: Iterable[int]) -> None:
        self.config = config
        self.stop_checker = StopChecker(eos_token_ids, config.max_model_len)
        self.kv_cache_manager = KVCacheManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.waiting = WaitingQueue()
        self.running: list[Sequence] = []  # admission order; at most max_num_seqs
        self.requests: dict[str, list[Sequence]] = {}  # request id -> its unfinished sequences
        self.num_preemptions = 0
        self.num_spec_drafts = 0  # speculative decoding: verifications of drafts
        self.num_spec_draft_tokens = 0  # tokens drafted and verified
        self.num_spec_accepted_tokens = 0  # drafted tokens the target agreed with
        self._num_seqs = 0  # unfinished sequences
        self._decode_wait_steps = 0  # consecutive steps that left ready decodes waiting

    @property
    def block_pool(self) -> BlockPool:
        return self.kv_cache_manager.block_pool

    @property
    def num_running_seqs(self) -> int:
        return len(self.running)

    @property
    def num_waiting_seqs(self) -> int:
        return self._num_seqs - len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def stats(self) -> EngineStats:
        """The queues, the pool's usage and the cumulative counters (see `EngineStats`)."""
        pool, kv = self.block_pool, self.kv_cache_manager
        return EngineStats(
            num_running=self.num_running_seqs,
            num_waiting=self.num_waiting_seqs,
            kv_cache_usage=pool.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_free_blocks=pool.num_free_blocks,
            num_total_blocks=pool.num_blocks,
            spec_decode_num_drafts=self.num_spec_drafts,
            spec_decode_num_draft_tokens=self.num_spec_draft_tokens,
            spec_decode_num_accepted_tokens=self.num_spec_accepted_tokens,
            **self._lora_stats(),
        )

    def _lora_stats(self) -> dict:
        """The LoRA fields of `EngineStats` (none on an engine without LoRA)."""
        if self.config.max_loras is None:
            return {}
        waiting = (s.lora_name for s in self.waiting if not s.is_finished)
        return dict(
            running_lora_adapters=tuple(sorted({s.lora_name for s in self.running} - {None})),
            waiting_lora_adapters=tuple(sorted(set(waiting) - {None})),
            max_lora=self.config.max_loras,
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
        self.requests[seq.request_id] = [seq]
        self._num_seqs += 1
        self.waiting.add_request(seq)

    def schedule(self) -> SchedulerOutput:
        """Plan the next step.

        Algorithm (vLLM v1): there is no prefill phase and no decode phase. Every sequence has
        ``num_tokens`` (prompt + output so far) and ``num_computed_tokens`` (those in the KV
        cache); a step gives it ``num_new_tokens = num_tokens - num_computed_tokens``, cut to what
        is left of the step's token budget (``max_num_batched_tokens``). One rule covers a whole
        prompt, a chunk of a long prompt (chunked prefill), the recomputation of a preempted
        request and a decode (one new token).

        1. Running decodes first, in admission order, so that a long prompt never stalls them;
           then the running sequences still in their prompt, in admission order, in chunks that
           fit the rest of the budget. Each gets the blocks its new tokens need. When the pool
           runs dry, the most recently admitted running sequence not yet scheduled in this step
           is preempted: its blocks are freed (cached full blocks stay findable), its
           ``num_computed_tokens`` reset to 0, and it goes back to the front of its waiting queue
           to be recomputed. This repeats until the allocation succeeds or the sequence has
           preempted itself.
        2. Then, unless something was preempted, waiting sequences are admitted while budget,
           ``max_num_seqs`` and blocks last: first forked completions (1..n-1 of n > 1 requests,
           in the order they were forked) while fewer than ``max_num_forked_seqs`` run, then
           requests' first completions in FCFS order. A sequence with nothing computed starts
           after its longest cached prefix. The first one that does not fit stops admission: no
           later one overtakes it. A fork held back by the cap does not stop admission.

        Prefill first (``max_decode_wait_steps`` = W > 0): while a prompt could be prefilled
        (a running sequence in its prompt, or a waiting one with a free slot) and the decodes
        have waited fewer than W consecutive steps, step 1 schedules the running prompts only
        and the decodes wait; if that schedules nothing (no blocks for the next prompt), the
        decodes run after all. A burst of P equal prompts of L tokens at a budget of L then
        gets its first tokens at steps 1..P, each step one prompt's prefill; decodes first
        makes step i also carry i - 1 decodes. The decodes of a running sequence wait at most
        W steps in a row, so a stream of arrivals cannot starve them.

        A sequence samples when its computed tokens reach its full length; the first time an
        n > 1 request samples, it forks its other n - 1 completions.

        Bound (no request may starve the others): forks hold at most
        ``F = max_num_forked_seqs`` slots, so a first completion competes for the other
        ``max_num_seqs - F`` with other requests' first completions only, as if every request
        had n = 1. With one n > 1 request running, a new request is scheduled in the step after
        it arrives if ``max_num_seqs >= F + 2``, ``max_num_batched_tokens > F + 1`` and the pool
        has blocks for its first chunk (test_scheduler.py checks it with n = 128). Without the
        cap it waited until all but ``max_num_seqs - 1`` of the n completions had finished.
        """
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        done: set[int] = set()  # id() of sequences scheduled or preempted in this step
        preempted: list[str] = []
        prefill_first = (
            self._decode_wait_steps < self.config.max_decode_wait_steps and self._prefill_ready()
        )
        for decodes in (False,) if prefill_first else (True, False):
            budget = self._schedule_running(decodes, budget, scheduled, done, preempted)
        budget = self._admit(budget, scheduled, preempted)
        if prefill_first and not scheduled:  # no blocks for the prompt: never an empty step
            budget = self._schedule_running(True, budget, scheduled, done, preempted)
        if self.config.max_decode_wait_steps:
            decodes_left = any(
                id(seq) not in done and seq.num_tokens - seq.num_computed_tokens == 1
                for seq in self.running
            )
            self._decode_wait_steps = self._decode_wait_steps + 1 if decodes_left else 0
        return SchedulerOutput(
            scheduled=tuple(scheduled),
            preempted_request_ids=tuple(preempted),
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
        )

    def _prefill_ready(self) -> bool:
        """Whether a step could prefill: a running sequence is in its prompt, or a waiting one
        may be admitted (a free slot; the block check is the admission's own)."""
        if any(seq.num_tokens - seq.num_computed_tokens > 1 for seq in self.running):
            return True
        if len(self.running) >= self.config.max_num_seqs:
            return False
        seq = self._next_waiting()
        return seq is not None and self._adapter_fits(seq)

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Whether ``seq`` may run beside the running sequences: its adapter is theirs, or
        they use fewer than ``max_loras`` distinct adapters (the engine's slots)."""
        limit = self.config.max_loras
        if seq.lora_name is None or limit is None:
            return True
        active = {s.lora_name for s in self.running if s.lora_name is not None}
        return seq.lora_name in active or len(active) < limit

    def _next_waiting(self, num_forks: int | None = None) -> Sequence | None:
        """The waiting sequence admission would take next: forks only while fewer than
        ``fork_limit`` run (``num_forks``: how many run; None counts them)."""
        if num_forks is None:
            num_forks = sum(seq.index > 0 for seq in self.running)
        return self.waiting.peek(forks_allowed=num_forks < self.config.fork_limit)

    def _schedule_running(
        self,
        decodes: bool,
        budget: int,
        scheduled: list[ScheduledSequence],
        done: set[int],
        preempted: list[str],
    ) -> int:
        """Schedule the running decodes (``decodes``) or the running prompts' next chunks, in
        admission order, preempting when the pool runs dry; returns the budget left."""
        for seq in list(self.running):
            if budget == 0:
                break
            num_left = seq.num_tokens - seq.num_computed_tokens
            if id(seq) in done or (num_left == 1) != decodes:
                continue
            num_new = min(num_left, budget)
            if decodes and seq.draft_token_ids:  # speculative: verify the drafts too
                del seq.draft_token_ids[budget - 1 :]
                num_new += len(seq.draft_token_ids)
            if self._allocate_or_preempt(seq, num_new, done, preempted):
                scheduled.append(self._plan(seq, num_new))
                done.add(id(seq))
                budget -= num_new
        return budget

    def _admit(self, budget: int, scheduled: list[ScheduledSequence], preempted: list[str]) -> int:
        """Admit waiting sequences while budget, slots and blocks last, and adapters fit the
        LoRA slots (FCFS; forks under their cap); returns the budget left."""
        kv = self.kv_cache_manager
        num_forks = sum(seq.index > 0 for seq in self.running)
        while not preempted and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._next_waiting(num_forks)
            if seq is None or not self._adapter_fits(seq):
                break
            new_request = seq.num_computed_tokens == 0
            cached = kv.get_computed_blocks(seq) if new_request else []
            num_cached = len(cached) * self.config.block_size
            num_new = min(seq.num_tokens - seq.num_computed_tokens - num_cached, budget)
            if not kv.allocate_slots(seq, num_new, cached):
                break
            if new_request:
                kv.record_lookup(seq.num_tokens, num_cached)
                if seq.num_output_tokens == 0:
                    seq.num_cached_tokens = num_cached
            seq.num_computed_tokens += num_cached
            self.waiting.pop(seq)
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(self._plan(seq, num_new))
            budget -= num_new
            num_forks += seq.index > 0
        return budget

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: Iterable[int]
    ) -> list[Sequence]:
        """Record a step's results: computed tokens, sampled tokens, forks and token stops.

        Each sampled token is checked by the `StopChecker` (EOS, stop token ids, ``max_tokens``,
        ``max_model_len``; see ``stop_checker.py``); a finished sequence's blocks are freed at
        once. Stop *strings* come later, from the detokenizer, through `stop_on_string`.
        Forked completions join the back of the waiting forks.

        Args:
            scheduler_output: the plan the step ran.
            sampled_token_ids: [S] one token per entry of ``scheduler_output.sampling``, in
                order; for a sequence with drafts (``num_draft_tokens``), the list of tokens
                its verification accepted (the agreeing drafts, then the target's next token).

        Returns:
            The sequences that received a token, in sampling order; finished ones have their
            FINISHED_* status. Requests aborted while the step ran are left out.

        Raises:
            ValueError: if the number of sampled tokens is not S.
        """
        sampled = [t if isinstance(t, list) else int(t) for t in sampled_token_ids]
        num_sampling = len(scheduler_output.sampling)
        if len(sampled) != num_sampling:
            raise ValueError(f"expected {num_sampling} sampled tokens, got {len(sampled)}")
        tokens = iter(sampled)
        updated = []
        for planned in scheduler_output.scheduled:
            seq = planned.seq
            group = (seq, *planned.forks) if planned.samples else ()
            group_tokens = [next(tokens) for _ in group]
            if seq.is_finished:
                for child in planned.forks:
                    self.kv_cache_manager.free(child)
                continue
            seq.num_computed_tokens = planned.num_computed_tokens + planned.num_new_tokens
            if planned.num_draft_tokens:  # the rejected drafts' KV is left to be overwritten
                num_accepted = len(group_tokens[0]) - 1
                seq.num_computed_tokens -= planned.num_draft_tokens - num_accepted
                self.num_spec_drafts += 1
                self.num_spec_draft_tokens += planned.num_draft_tokens
                self.num_spec_accepted_tokens += num_accepted
                group_tokens = [group_tokens[0]]
            else:
                group_tokens = [[t] for t in group_tokens]
            seq.draft_token_ids = []
            seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
            for child in planned.forks:
                child.status = SequenceStatus.WAITING
                self.requests[seq.request_id].append(child)
                self._num_seqs += 1
            for s, accepted in zip(group, group_tokens, strict=True):
                updated.append(s)
                for token in accepted:  # accepted speculative tokens stop like sampled ones
                    s.append_token(token)
                    status = self.stop_checker.check(s)
                    if status is not None:
                        self._finish(s, status)
                        break
            self.waiting.add_forks(c for c in planned.forks if not c.is_finished)
        return updated

    def fail_step(self, scheduler_output: SchedulerOutput) -> tuple[str, ...]:
        """Undo a step that did not run to the end (the model raised), instead of
        `update_from_output`, and abort the requests it carried.

        The blocks the step was to fill entered the prefix cache when they were allocated
        (`KVCacheManager.allocate_slots`), before their KV was written; they leave it here, so a
        later request with the same prefix computes them again instead of reading garbage.
        Forked completions created for the step are dropped, then every request with a sequence
        in the step is aborted (all its completions), which frees its blocks. Requests not in
        the step keep their state: a step writes only its own tokens' slots. Call it before
        anything else touches the step's requests (an abort in between would free blocks that
        are still cached).

        Returns:
            The ids of the aborted requests, in step order.
        """
        kv = self.kv_cache_manager
        failed: dict[str, None] = {}
        for planned in scheduler_output.scheduled:
            kv.uncache_step(planned.seq, planned.num_computed_tokens, planned.num_new_tokens)
            for child in planned.forks:  # not yet in `requests`: nothing else frees them
                kv.free(child)
            failed[planned.seq.request_id] = None
        for request_id in failed:
            self.abort_request(request_id)
        return tuple(failed)

    def finish_request(
        self, request_id: str, status: SequenceStatus, index: int | None = None
    ) -> None:
        """End a request's sequences from outside (a stop string, an abort); free their blocks.

        ``index`` ends one completion only; None ends all. Unknown or already finished ids are
        ignored: an abort may race with the request's end.

        Raises:
            ValueError: if ``status`` is not a FINISHED_* status.
        """
        if not status.is_finished:
            raise ValueError(f"finish_request needs a FINISHED_* status, got {status.name}")
        for seq in list(self.requests.get(request_id, ())):
            if index is None or seq.index == index:
                self._finish(seq, status)

    def stop_on_string(self, seq: Sequence, stop: str) -> None:
        """End ``seq`` for the stop string ``stop``, which the detokenizer found in the text of
        its latest token; it becomes ``seq.stop_reason``. When that token also ended the
        sequence (a length limit, a stop token), the stop string wins: the status becomes
        FINISHED_STOPPED (as in vLLM)."""
        seq.stop_reason = stop
        if seq.is_finished:
            seq.status = SequenceStatus.FINISHED_STOPPED
        else:
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)

    def abort_request(self, request_id: str) -> None:
        """Cancel a request wherever it is; unknown or finished ids are ignored."""
        self.finish_request(request_id, SequenceStatus.FINISHED_ABORTED)

    def _plan(self, seq: Sequence, num_new: int) -> ScheduledSequence:
        start = seq.num_computed_tokens
        num_drafts = len(seq.draft_token_ids)
        reaches_end = start + num_new - num_drafts == seq.num_tokens
        params = seq.params
        num_prompt_logprobs = 0
        if params.prompt_logprobs is not None and seq.num_output_tokens == 0:
            num_prompt_logprobs = max(min(start + num_new, seq.num_prompt_tokens - 1) - start, 0)
        forks: tuple[Sequence, ...] = ()
        if reaches_end and params.n > 1 and seq.index == 0 and seq.num_output_tokens == 0:
            forks = tuple(seq.fork(i) for i in range(1, params.n))
            for child in forks:
                self.kv_cache_manager.fork(seq, child)
        return ScheduledSequence(
            seq, start, num_new, reaches_end, num_prompt_logprobs, forks, num_drafts
        )

    def _allocate_or_preempt(
        self, seq: Sequence, num_new: int, done: set[int], preempted: list[str]
    ) -> bool:
        """Allocate for ``seq``, preempting the newest running sequences not yet scheduled.

        Returns False when ``seq`` itself had to be preempted.
        """
        while not self.kv_cache_manager.allocate_slots(seq, num_new):
            victim = next(s for s in reversed(self.running) if id(s) not in done)
            self.running.remove(victim)
            self.kv_cache_manager.free(victim)
            victim.num_computed_tokens = victim.num_draft_computed = 0
            victim.draft_token_ids = []
            victim.status = SequenceStatus.WAITING
            self.waiting.requeue(victim)
            done.add(id(victim))
            preempted.append(victim.request_id)
            self.num_preemptions += 1
            if victim is seq:
                return False
        return True

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)  # O(max_num_seqs), a small bound
        seq.status = status
        self.kv_cache_manager.free(seq)
        group = self.requests[seq.request_id]
        group.remove(seq)
        if not group:
            del self.requests[seq.request_id]
        self._num_seqs -= 1
