"""The engine loop: schedule, run, sample, detokenize, one step at a time (in-flight batching)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from llmc.errors import StepFailedError
from llmc.runtime.engine_config import EngineConfig, engine_config_for
from llmc.runtime.lora.adapter_table import AdapterTable, adapter_table
from llmc.runtime.lora.errors import LoRAAdapterError, LoRANotFoundError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.lora.peft_adapter import PeftAdapter
from llmc.runtime.lora.stored import stored_lora_requests
from llmc.runtime.output_processor import OutputProcessor
from llmc.runtime.outputs import RequestOutput
from llmc.runtime.request_check import check_request
from llmc.runtime.runners.engine_loader import LoadedEngine, load_engine
from llmc.runtime.runners.runner import Runner
from llmc.runtime.runners.warmup import warmup_step
from llmc.runtime.sampling.sampler import Sampler
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.scheduling.scheduler import Scheduler, SchedulerOutput
from llmc.runtime.scheduling.step_builder import build_step_inputs
from llmc.runtime.sequence import Sequence
from llmc.runtime.spec_decode.rules import verify_greedy, verify_sampled
from llmc.runtime.spec_decode.speculative_config import SpeculativeConfig
from llmc.runtime.spec_decode.speculator import Speculator, load_speculator
from llmc.runtime.stats import EngineStats
from llmc.runtime.structured.grammar import GrammarState
from llmc.runtime.structured.grammar_compiler import GrammarCompiler


class LLMEngine:
    """Serves requests over one runner with in-flight batching: requests join and leave at
    every step.

    Args:
        runner: executes steps and owns the KV cache.
        tokenizer: the model's Hugging Face tokenizer (for detokenization).
        config: limits; checked against the runner.
        eos_token_ids: the model's end-of-sequence token ids.
        speculator: speculative decoding (``speculator.py``); None decodes one token per step.
        loras: a LoRA engine's adapters (``llmc.runtime.lora``); None: an engine without.

    Raises:
        ValueError: if ``config`` does not fit the runner (block size, cache size) or a limit is
            invalid.
    """

    def __init__(
        self,
        runner: Runner,
        tokenizer: Any,
        config: EngineConfig,
        eos_token_ids: set[int],
        speculator: Speculator | None = None,
        loras: AdapterTable | None = None,
    ) -> None:
        if config.block_size != runner.block_size:
            raise ValueError(
                f"block_size {config.block_size} differs from the runner's {runner.block_size}"
            )
        if config.num_blocks > runner.num_blocks:
            raise ValueError(
                f"num_blocks {config.num_blocks} exceeds the runner's KV cache of "
                f"{runner.num_blocks} blocks"
            )
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = config.max_model_len
        self.scheduler = Scheduler(config.scheduler_config(), eos_token_ids)
        self.sampler = Sampler(config.seed, eos_token_ids)
        self.outputs = OutputProcessor(tokenizer)  # one state per unfinished request
        # structured outputs: grammars compiled for this tokenizer (tables built on first use)
        self.grammars = GrammarCompiler(tokenizer, runner.vocab_size, eos_token_ids)
        self.speculator = speculator
        self.loras = loras

    @classmethod
    def from_engine_dir(
        cls,
        path: str | Path,
        *,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_forked_seqs: int | None = None,
        max_decode_wait_steps: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int | None = None,
        num_blocks: int | None = None,
        kv_cache_memory: int | None = None,
        threads: int | None = None,
        warmup: bool = True,
        expected_manifest_sha256: str | None = None,
        speculative_config: SpeculativeConfig | dict | None = None,
        max_cpu_loras: int | None = None,
    ) -> LLMEngine:
        """Load an engine directory and serve it.

        Args:
            path: the engine directory (``manifest.json`` and engine files).
            max_model_len, max_num_seqs, max_num_batched_tokens: `EngineConfig` limits; None:
                the engine's build limits (``max_seq_len``, ``max_batch``,
                ``max_num_tokens``), which a TensorRT plan's profiles cannot run past; a cpu
                engine's step budget defaults to at most ``serving_defaults.CPU_STEP_TOKENS``.
            max_num_forked_seqs, enable_prefix_caching, seed: as `EngineConfig`.
            max_decode_wait_steps: as `EngineConfig`; None: ``default_decode_wait`` (a cpu
                engine prefill first, others decodes first).
            num_blocks: KV blocks the runner allocates; None sizes the cache from
                ``kv_cache_memory`` (see ``engine_loader.plan_num_blocks``). Either way the pool
                must hold one sequence of ``max_model_len`` tokens.
            kv_cache_memory: KV cache budget in bytes when ``num_blocks`` is None.
            threads: runner threads; None lets the runner choose.
            warmup: run `warm_up` before returning (a few seconds on Gemma 3 270M).
            expected_manifest_sha256: the sha256 (hex) ``manifest.json`` must have, e.g. the
                registry's (``ResolvedEngine.manifest_sha256``); None: not checked.
            speculative_config: speculative decoding (`SpeculativeConfig` or vLLM's dict);
                ``"draft"`` loads the draft engine (``model``, else the ``draft/`` that
                ``llmc build --draft`` wrote, checked against the digest this manifest
                recorded) with this engine's KV blocks.
            max_cpu_loras: a LoRA engine's adapters kept loaded in host memory (vLLM's
                ``--max-cpu-loras``); None: its slots' number. The adapters stored with the
                engine (``lora/``, ``llmc lora add``) are added under their names.

        Raises:
            ValueError: if ``max_model_len`` exceeds the engine's ``max_seq_len``
                (``EngineConfigError``), or as `__init__`.
            llmc.errors.EngineError: from the loader (no engine, built for another host, corrupt,
                a KV pool smaller than one ``max_model_len`` sequence).
        """
        if isinstance(speculative_config, dict):  # refused before any weight is read
            speculative_config = SpeculativeConfig.from_dict(speculative_config)
        loaded = load_engine(
            path,
            num_blocks=num_blocks,
            kv_cache_memory=kv_cache_memory,
            threads=threads,
            max_model_len=max_model_len,
            expected_manifest_sha256=expected_manifest_sha256,
        )
        config = engine_config_for(
            loaded,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_forked_seqs=max_num_forked_seqs,
            max_decode_wait_steps=max_decode_wait_steps,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
        )
        speculator = _load_speculator(speculative_config, path, loaded, config, threads)
        loras = adapter_table(loaded, max_cpu_loras)
        engine = cls(
            loaded.runner, loaded.tokenizer, config, loaded.eos_token_ids, speculator, loras
        )
        for lora_request in stored_lora_requests(path):  # ``llmc lora add``'s
            engine.add_lora(lora_request)
        if warmup:
            engine.warm_up()
        return engine

    def warm_up(self) -> None:
        """Run the largest step the limits allow (``max_num_batched_tokens`` tokens over up to
        ``max_num_seqs`` prefills) once, outside the scheduler, so that the runner's memory is
        in place before the first request (see ``llmc.runtime.runners.warmup``). Call it before any
        request: it writes into KV blocks that must be free. Raises what the runner raises."""

        c = self.config
        self.runner.execute(
            warmup_step(
                c.max_num_batched_tokens,
                c.max_num_seqs,
                c.max_model_len,
                c.block_size,
                c.num_blocks,
            )
        )

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size (columns of its logits); token ids are below it."""
        return self.runner.vocab_size

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        grammar: Any = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request; it starts at the next `step` that has room for it.

        ``grammar``: the compiled start state of ``params.structured_outputs``
        (``self.grammars.compile``, e.g. on another thread, as the server does); None compiles
        it here. ``lora_request``: the LoRA adapter that serves it (added to the engine's
        adapters if new, ``add_lora``); None: the base model.

        Raises:
            InvalidRequestError: (a ValueError) bad sampling parameters, an empty prompt, a
                prompt or stop token id outside the vocabulary (`check_request`), or a
                structured-output constraint that does not compile or fails its probe
                (``grammar_compiler.py``); its ``field`` names which.
            ContextLengthError: (a ValueError) if the prompt plus ``max_tokens`` is longer than
                ``max_model_len``; it carries ``limit`` and ``num_tokens``.
            LoRAAdapterError: (an InvalidRequestError) an adapter the engine cannot serve, or
                any adapter on an engine built without ``--enable-lora``.
            ValueError: for the id of an unfinished request.
        """
        check_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        seq = Sequence(request_id, [int(t) for t in prompt_token_ids], params, prompt=prompt)
        if lora_request is not None:
            seq.lora_name = lora_request.lora_name
            seq.lora_digest = self.add_lora(lora_request).digest
        if params.structured_outputs is not None:
            constraint = params.structured_outputs
            start = grammar if grammar is not None else self.grammars.compile(constraint)
            seq.grammar = GrammarState(start)
        self.scheduler.add_request(seq)
        self.outputs.add_request(seq)

    def add_lora(self, lora_request: LoRARequest) -> PeftAdapter:
        """Load a LoRA adapter (``LoRARequest``) for requests to use; the adapter. Raises
        LoRAAdapterError for one the engine cannot serve, or on an engine without LoRA
        slots."""
        if self.loras is None:
            raise LoRAAdapterError(
                f"adapter {lora_request.lora_name!r}: this engine has no LoRA slots; rebuild "
                "it with `llmc build MODEL --enable-lora`"
            )
        return self.loras.add(lora_request)

    def remove_lora(self, lora_name: str) -> None:
        """Unload adapter ``lora_name``. Raises LoRANotFoundError if it is not loaded,
        LoRAAdapterError while an unfinished request uses it."""
        if self.loras is None or lora_name not in self.loras:
            raise LoRANotFoundError(f"no LoRA adapter named {lora_name!r} is loaded")
        in_use = [
            request_id
            for request_id, seqs in self.scheduler.requests.items()
            if any(seq.lora_name == lora_name for seq in seqs)
        ]
        if in_use:
            raise LoRAAdapterError(
                f"adapter {lora_name!r} serves {len(in_use)} unfinished request(s); unload it "
                "when they finish"
            )
        self.loras.remove(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        """The loaded adapters, in the order they were added."""
        return self.loras.requests() if self.loras is not None else []

    def abort_request(self, request_id: str) -> None:
        """Cancel a request and free its blocks; unknown or finished ids are ignored."""
        self.scheduler.abort_request(request_id)
        self.outputs.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> EngineStats:
        """A snapshot of the queues, the KV pool and the cumulative counters."""
        return self.scheduler.stats()

    def step(self) -> list[RequestOutput]:
        """Run one step.

        Returns:
            One output for every request that got a token in this step (finished or not), in
            step order; an n > 1 request's output holds all its completions so far. Prompt chunks
            that do not reach the end of their prompt produce none.

        Raises:
            StepFailedError: the runner, the sampler or recording the results raised (the
                ``__cause__``; ``in_runner`` says whether the runner itself did). The step's
                requests are aborted (``Scheduler.fail_step``: their blocks are freed, those
                the step was to fill leave the prefix cache); the others keep their state, and
                the engine can keep stepping. If planning the step raised,
                which requests it touched is unknown: every unfinished request is aborted.
        """
        try:
            if self.speculator is not None:
                scheduler = self.scheduler
                self.speculator.before_schedule(scheduler.running, scheduler.num_waiting_seqs)
            scheduler_output = self.scheduler.schedule()
        except Exception as exc:
            raise self._failed(exc, self._abort_all_unwritten()) from exc
        if not scheduler_output.scheduled:
            return []
        try:
            if self.speculator is not None:
                self.speculator.after_schedule(scheduler_output)
            token_ids = self._execute(scheduler_output)
            return self._update(scheduler_output, token_ids)
        except _RunnerFailed as failed:
            exc = failed.__cause__
            raise self._failed(exc, self.scheduler.fail_step(scheduler_output), True) from exc
        except Exception as exc:
            raise self._failed(exc, self.scheduler.fail_step(scheduler_output)) from exc

    def _update(
        self, scheduler_output: SchedulerOutput, token_ids: list[int | list[int]]
    ) -> list[RequestOutput]:
        """Record the step's sampled (or accepted) tokens (token stops), detokenize them (stop
        strings: ``stop_checker.py``); the step's outputs."""
        updated = self.scheduler.update_from_output(scheduler_output, token_ids)
        touched: dict[str, None] = {}
        for seq in updated:
            stop = self.outputs.update(seq)
            if stop is not None:
                self.scheduler.stop_on_string(seq, stop)
            touched[seq.request_id] = None
        return self.outputs.make_outputs(touched)

    def _failed(
        self, exc: BaseException, request_ids: tuple[str, ...], in_runner: bool = False
    ) -> StepFailedError:
        """Drop the output state of the failed step's (already aborted) requests; the error."""
        for request_id in request_ids:
            self.outputs.abort_request(request_id)
        return StepFailedError(
            f"the model step failed ({exc!r}); its requests {list(request_ids)} were aborted",
            request_ids=request_ids,
            in_runner=in_runner,
        )

    def _abort_all_unwritten(self) -> tuple[str, ...]:
        """After ``schedule()`` raised: every block no step has written leaves the prefix cache
        (``schedule`` may have cached some), then every unfinished request is aborted; their
        ids. (It belongs beside ``Scheduler.fail_step``, which needs the plan.)"""
        scheduler = self.scheduler
        for seqs in scheduler.requests.values():
            for seq in seqs:
                num_unwritten = seq.num_tokens - seq.num_computed_tokens
                scheduler.kv_cache_manager.uncache_step(seq, seq.num_computed_tokens, num_unwritten)
        request_ids = tuple(scheduler.requests)
        for request_id in request_ids:
            scheduler.abort_request(request_id)
        return request_ids

    def _execute(self, scheduler_output: SchedulerOutput) -> list[int | list[int]]:
        """Run the planned step and sample: per sequence of ``scheduler_output.sampling``, in
        order, its sampled token, or for a sequence with drafts the tokens their verification
        accepted (``spec_decode.verify_greedy``). Changes no scheduler state."""
        step_inputs = build_step_inputs(scheduler_output, self.config.block_size)
        if self.loras is not None:
            planned = scheduler_output.scheduled
            ids = self.loras.slot_ids(
                [p.seq.lora_name for p in planned], [p.num_new_tokens for p in planned]
            )
            step_inputs = dataclasses.replace(step_inputs, lora_slot_ids=ids)
        try:
            logits = self.runner.execute(step_inputs)  # logits: [R, V], R = sum of rows
        except Exception as exc:
            raise _RunnerFailed() from exc
        sampling = scheduler_output.sampling
        results: list[int | list[int]] = [0] * len(sampling)
        sample_rows, sample_at = [], []  # logits row, index in `sampling`
        row = at = 0
        for planned in scheduler_output.scheduled:
            if planned.num_prompt_logprobs:
                rows = logits[row : row + planned.num_prompt_logprobs]
                self.outputs.record_prompt_logprobs(planned.seq, planned.num_computed_tokens, rows)
                row += planned.num_prompt_logprobs
            if not planned.samples:
                continue
            if planned.num_draft_tokens:
                end = row + 1 + planned.num_draft_tokens
                results[at] = self._verify(planned.seq, logits[row:end])
                row, at = end, at + 1
                continue
            for _ in range(1 + len(planned.forks)):  # forks share the row
                sample_rows.append(row)
                sample_at.append(at)
                at += 1
            row += 1
        if not sample_rows:
            return results
        seqs = [sampling[i] for i in sample_at]
        if sample_rows != list(range(len(logits))):
            logits = logits[sample_rows]  # logits: [S, V]
        # logprobs are of the raw logits: without them the sampler may write into its rows
        in_place = all(seq.params.logprobs is None for seq in seqs)
        token_ids = self.sampler(logits, seqs, in_place)
        self.outputs.record_logprobs(seqs, logits, token_ids)
        for i, token in zip(sample_at, token_ids, strict=True):
            results[i] = int(token)
        return results

    def _verify(self, seq: Sequence, rows: np.ndarray) -> list[int]:
        """The tokens a speculating sequence accepts from its 1 + k logits rows."""
        if seq.params.is_greedy:
            return verify_greedy(rows, seq.draft_token_ids)
        probs = Sampler.probabilities(rows.copy(), [seq.params] * len(rows))
        return verify_sampled(probs, seq.draft_token_ids, seq.generator or self.sampler.generator)


class _RunnerFailed(Exception):
    """The runner raised (its error is the ``__cause__``): the failure of the engine, not of
    a request, which is what a dead-man count may count."""


def _load_speculator(
    speculative_config: SpeculativeConfig | None,
    path: str | Path,
    loaded: LoadedEngine,
    config: EngineConfig,
    threads: int | None,
) -> Speculator | None:
    """The speculator of ``speculative_config`` for ``config``'s limits; None without one."""
    if speculative_config is None:
        return None
    return load_speculator(
        speculative_config,
        path,
        loaded,
        config.max_model_len,
        config.max_num_batched_tokens,
        threads,
    )
