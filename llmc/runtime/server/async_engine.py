"""An asyncio front for the blocking, single-threaded ``LLMEngine``.

``LLMEngine`` is not thread-safe and ``step()`` is tens of milliseconds of CPU work, so it can
neither run on the event loop nor be called from many threads. ``AsyncLLMEngine`` gives it one
thread of its own. Coroutines talk to that thread through an inbox (add / abort commands, under a
condition variable); the thread applies the inbox between steps, runs ``step()`` while any
request is unfinished and sleeps on the condition when idle. Each request's outputs go back to
its coroutine through an ``asyncio.Queue`` fed with ``loop.call_soon_threadsafe``.
The design is vLLM's ``AsyncLLMEngine`` (v0) with the engine loop on a thread instead of a task.

A step that raises fails only the requests in it (``StepFailedError``, which the server turns
into a 500 or an in-band SSE error); the engine goes on with the others. Only when
``max_consecutive_step_failures`` steps in a row fail in the runner itself
(``StepFailedError.in_runner``) is the runner taken to be broken: the engine stops and every
request, then and later, gets ``EngineDeadError``. A request's own failure (its constraint
failing mid-generation: ``GrammarError``; a step's sampling or bookkeeping raising) ends that
request, or that step's, and never counts: no request can stop the engine.

Constraints are compiled before the request is queued, off the engine thread
(``grammar_pool.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

from llmc.errors import StepFailedError
from llmc.runtime.outputs import RequestOutput
from llmc.runtime.request_check import check_request
from llmc.runtime.server.errors import EngineDeadError, QueueFullError
from llmc.runtime.server.grammar_pool import GrammarPool
from llmc.runtime.server.request_stream import (
    FINISH_OUTCOMES,
    Abort,
    AbortAll,
    Add,
    Command,
    LoRAChange,
    RequestStream,
    StreamItem,
    finish_outcome,
)
from llmc.runtime.structured.grammar import GrammarError

if TYPE_CHECKING:
    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.lora.lora_request import LoRARequest
    from llmc.runtime.sampling_params import SamplingParams
    from llmc.runtime.stats import EngineStats

logger = logging.getLogger(__name__)


class AsyncLLMEngine:
    """Runs an ``LLMEngine`` on one background thread and streams its outputs to coroutines.

    Args:
        engine: the engine; from now on only this object's thread may touch it.
        max_waiting: how many requests may wait for their first output (queued or in prefill)
            before ``generate`` refuses new ones with ``QueueFullError``.
        max_consecutive_step_failures: steps in a row whose runner failed after which the
            engine is dead (``/health`` 503); a step that succeeds starts the count again.
        grammar_compile_workers: threads compiling structured-output constraints.
        grammar_compile_timeout: how long a request may wait for its constraint, seconds.

    Raises:
        ValueError: if ``max_consecutive_step_failures`` or ``grammar_compile_workers`` is
            below 1, or the timeout is not positive.
    """

    def __init__(
        self,
        engine: LLMEngine,
        max_waiting: int = 64,
        max_consecutive_step_failures: int = 3,
        grammar_compile_workers: int = 2,
        grammar_compile_timeout: float = 10.0,
    ) -> None:
        if max_consecutive_step_failures < 1:
            raise ValueError(
                f"max_consecutive_step_failures must be >= 1, got {max_consecutive_step_failures}"
            )
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.max_model_len
        self.max_waiting = max_waiting
        self.max_consecutive_step_failures = max_consecutive_step_failures
        self._engine = engine
        # the engine's grammar compiler is thread-safe: the one part of it other threads use
        self._grammars = GrammarPool(
            engine.grammars, grammar_compile_workers, grammar_compile_timeout
        )
        self._cond = threading.Condition()
        self._inbox: list[Command] = []
        self._stopping = False
        self._dead: EngineDeadError | None = None
        self._num_waiting = 0
        self._num_in_flight = 0
        self._num_finished = dict.fromkeys(FINISH_OUTCOMES, 0)
        self._stats: EngineStats = engine.stats()  # replaced by the engine thread, never mutated
        # The engine's LoRA adapters by name, replaced by the engine thread after a change.
        self._loras: dict[str, LoRARequest] = {r.lora_name: r for r in engine.list_loras()}
        self._thread = threading.Thread(target=self._run, name="llmc-engine", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Requests submitted that have not produced their first output yet."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Requests that have produced output and are not finished."""
        return self._num_in_flight - self._num_waiting

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished (waiting or running)."""
        return self._num_in_flight

    @property
    def num_finished(self) -> dict[str, int]:
        """Requests the engine accepted that have ended, by outcome (`FINISH_OUTCOMES`); each
        counted once, when its ``generate`` ends. Requests refused before they started
        (``QueueFullError``, ``ValueError``, a dead engine) are not counted. A copy."""
        with self._cond:
            return dict(self._num_finished)

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size (columns of its logits); token ids are below it. Read
        from the runner on demand: a constant, safe to read from any thread."""
        return self._engine.vocab_size

    @property
    def block_size(self) -> int:
        """Tokens per KV block (the prefix cache's granularity); a constant."""
        return self._engine.config.block_size

    @property
    def stats(self) -> EngineStats:
        """The engine's statistics after its latest step or abort (block pool, prefix cache,
        preemptions); a snapshot, safe to read from any thread."""
        return self._stats

    def lora_request(self, name: str) -> LoRARequest | None:
        """The loaded LoRA adapter named ``name``, None if there is none."""
        return self._loras.get(name)

    @property
    def loras(self) -> list[LoRARequest]:
        """The loaded LoRA adapters, in the order they were added; a snapshot."""
        return list(self._loras.values())

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter on the engine thread, between steps. Raises as
        ``LLMEngine.add_lora`` (``LoRAAdapterError``), EngineDeadError when it has stopped."""
        await self._change_lora(lora_request)

    async def remove_lora(self, lora_name: str) -> None:
        """Unload an adapter on the engine thread, between steps. Raises as
        ``LLMEngine.remove_lora`` (``LoRANotFoundError``, ``LoRAAdapterError`` while in use)."""
        await self._change_lora(lora_name)

    async def _change_lora(self, change) -> None:
        done: Future = Future()
        with self._cond:
            self._check_alive()
            self._inbox.append(LoRAChange(change, done))
            self._cond.notify()
        await asyncio.wrap_future(done)

    @property
    def is_running(self) -> bool:
        """Whether the engine thread is alive and accepting requests."""
        return self._dead is None and not self._stopping and self._thread.is_alive()

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request (served by the adapter ``lora_request``, None: the base model)
        and yield its outputs until it finishes.

        Outputs are cumulative (``outputs[0].text`` is the whole text so far); when the consumer
        is slower than the engine, intermediate outputs are skipped (never the first). Stopping
        the iteration early (``break``, ``aclose()``, cancellation on client disconnect) aborts
        the request, which frees its KV blocks.

        Raises (before any output is yielded, unless noted):
            QueueFullError: ``max_waiting`` requests are already waiting, or no grammar
                worker was free in time.
            EngineDeadError: the engine thread has stopped (also mid-stream).
            ValueError: ``check_request`` refused the request (``InvalidRequestError`` naming
                the field, ``ContextLengthError``), or its constraint (``GrammarPool.compile``).
            GrammarError: the request's constraint failed while it generated (mid-stream
                too); the request is aborted, the engine goes on.
            StepFailedError: a step that held this request failed (also mid-stream); the
                request is aborted and its blocks are free.
        """
        # A request the engine would refuse is refused here too, before it queues: it gets its
        # 400 even when the queue is full (the engine checks again; it is one function).
        check_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        stream = RequestStream(request_id, asyncio.get_running_loop(), asyncio.Queue())
        with self._cond:
            self._check_open()
            self._num_waiting += 1  # a place in the queue, held while the constraint compiles
            self._num_in_flight += 1
        try:
            grammar = None
            if params.structured_outputs is not None:
                grammar = await self._grammars.compile(params.structured_outputs)
            with self._cond:
                self._check_alive()  # it may have stopped while the constraint compiled
                add = Add(stream, list(prompt_token_ids), params, prompt, grammar, lora_request)
                self._inbox.append(add)
                self._cond.notify()
        except BaseException:
            with self._cond:
                self._num_waiting -= 1
                self._num_in_flight -= 1
            raise
        waiting, finished = True, False
        outcome: str | None = "abort"  # unless it finishes or fails
        try:
            while not finished:
                item = await stream.queue.get()
                # Outputs are cumulative: keep the latest. Never skip the first one, which
                # carries exactly the first token (for TTFT and inter-token latencies).
                while not waiting and not stream.queue.empty() and not _is_final(item):
                    item = stream.queue.get_nowait()
                if waiting:
                    waiting = False
                    self._count_started()
                if isinstance(item, BaseException):
                    finished = True  # the engine holds nothing of this request any more
                    # A ValueError is add_request refusing it: it never started.
                    outcome = None if isinstance(item, ValueError) else "error"
                    raise item
                finished = item.finished
                if finished:
                    outcome = finish_outcome(item)
                yield item
        finally:
            if waiting:
                self._count_started()
            with self._cond:
                self._num_in_flight -= 1
                if outcome is not None:
                    self._num_finished[outcome] = self._num_finished.get(outcome, 0) + 1
            if not finished:
                self._submit(Abort(request_id))

    def abort_all(self) -> None:
        """End every unfinished request now: each gets a last output with what it generated so
        far and finish_reason "abort" (unless already finished), and its blocks are freed.
        Used when a drain runs out of time."""
        self._submit(AbortAll())

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread after its current step; unfinished requests fail with
        ``EngineDeadError``. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._grammars.shutdown()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _check_open(self) -> None:
        """Under ``_cond``: raise unless the engine takes requests and the queue has room."""
        self._check_alive()
        if self._num_waiting >= self.max_waiting:
            raise QueueFullError(
                f"{self._num_waiting} requests are already waiting (max_waiting="
                f"{self.max_waiting}); retry later"
            )

    def _check_alive(self) -> None:
        """Under ``_cond``: raise ``EngineDeadError`` unless the engine takes requests."""
        if self._dead is not None or self._stopping:
            raise self._dead or EngineDeadError("the engine is shutting down")

    def _count_started(self) -> None:
        with self._cond:
            self._num_waiting -= 1

    def _submit(self, command: Command) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def _run(self) -> None:
        """The engine thread: apply the inbox, step while there is work, sleep when idle."""
        streams: dict[str, tuple[RequestStream, Add]] = {}
        error = EngineDeadError("the engine is shut down")
        num_failed, failure = 0, None  # failed steps in a row, the latest failure
        try:
            busy = False
            while True:
                with self._cond:
                    while not self._inbox and not self._stopping and not busy:
                        self._cond.wait()
                    if self._stopping:
                        break
                    commands, self._inbox = self._inbox, []
                for command in commands:
                    self._apply(command, streams)
                if self._engine.has_unfinished_requests():
                    try:
                        outputs, num_failed = self._engine.step(), 0
                    except Exception as exc:
                        if _is_runner_failure(exc):
                            num_failed, failure = num_failed + 1, exc
                        outputs = self._fail_step(exc, streams, num_failed)
                    # Before any output reaches a client, so what it then reads is this step's.
                    self._stats = self._engine.stats()
                    if num_failed >= self.max_consecutive_step_failures:
                        error = EngineDeadError(
                            f"the engine stopped after {num_failed} failed steps in a row; the "
                            f"last: {_cause(failure)!r}"
                        )
                        break
                    for output in outputs:
                        entry = streams.get(output.request_id)
                        if entry is None:  # aborted while the step ran
                            continue
                        error = _constraint_error(output)
                        if error is not None:  # the request's own failure: it alone ends
                            self._abort(output.request_id, streams)
                            entry[0].put(error)
                            continue
                        if output.finished:
                            del streams[output.request_id]
                        entry[0].put(output)
                busy = self._engine.has_unfinished_requests()
                self._stats = self._engine.stats()
        except Exception as exc:
            logger.exception("the engine loop failed; no further requests will be served")
            error = EngineDeadError(f"the engine stopped after an error: {exc!r}")
        with self._cond:
            self._dead = error
            pending, self._inbox = self._inbox, []
        for stream, _ in streams.values():
            stream.put(error)
        for command in pending:
            if isinstance(command, Add):
                command.stream.put(error)
            elif isinstance(command, LoRAChange):
                command.done.set_exception(error)

    def _fail_step(
        self, exc: Exception, streams: dict[str, tuple[RequestStream, Add]], num_failed: int
    ) -> list[RequestOutput]:
        """End the requests of a step that raised with ``StepFailedError``: those the
        ``StepFailedError`` names (``LLMEngine.step`` has aborted them), or, for an engine that
        raises anything else, every request (aborted here). The step's outputs: none."""
        logger.error(
            "a step failed (%d in a row; the engine stops at %d); its requests end with an error",
            num_failed,
            self.max_consecutive_step_failures,
            exc_info=exc,
        )
        if isinstance(exc, StepFailedError):
            failed = [streams.pop(r) for r in exc.request_ids if r in streams]
        else:
            failed = list(streams.values())
            for request_id in list(streams):
                self._abort(request_id, streams)
        for stream, _ in failed:
            message = f"the model step running this request failed ({_cause(exc)!r}); aborted"
            stream.put(StepFailedError(message, request_ids=(stream.request_id,)))
        return []

    def _apply(self, command: Command, streams: dict[str, tuple[RequestStream, Add]]) -> None:
        """Apply one inbox command on the engine thread."""
        if isinstance(command, AbortAll):
            for request_id, (stream, add) in list(streams.items()):
                self._abort(request_id, streams)
                stream.put(stream.aborted(add))
            return
        if isinstance(command, Abort):
            self._abort(command.request_id, streams)
            return
        if isinstance(command, LoRAChange):
            self._apply_lora(command)
            return
        stream = command.stream
        if stream.request_id in streams:
            stream.put(ValueError(f"request id {stream.request_id!r} is already in use"))
            return
        try:
            self._engine.add_request(
                stream.request_id,
                command.prompt_token_ids,
                command.params,
                prompt=command.prompt,
                grammar=command.grammar,
                lora_request=command.lora_request,
            )
        except Exception as exc:  # refused (ValueError) or an engine bug: fail this request only
            stream.put(exc)
            return
        streams[stream.request_id] = (stream, command)

    def _apply_lora(self, command: LoRAChange) -> None:
        """Load or unload an adapter (on the engine thread); the outcome to ``command.done``."""
        try:
            if isinstance(command.change, str):
                self._engine.remove_lora(command.change)
            else:
                self._engine.add_lora(command.change)
        except Exception as exc:
            command.done.set_exception(exc)
            return
        self._loras = {r.lora_name: r for r in self._engine.list_loras()}
        command.done.set_result(None)

    def _abort(self, request_id: str, streams: dict[str, tuple[RequestStream, Add]]) -> None:
        if streams.pop(request_id, None) is not None:
            try:
                self._engine.abort_request(request_id)
            except Exception:  # a failed abort must not stop the other requests
                logger.exception("aborting request %s failed", request_id)


def _is_runner_failure(exc: Exception) -> bool:
    """Whether a failed step says the engine may be broken: its runner raised, or the engine
    raised something other than its own ``StepFailedError``."""
    return not isinstance(exc, StepFailedError) or exc.in_runner


def _constraint_error(output: RequestOutput) -> GrammarError | None:
    """The error of a completion of ``output`` whose constraint failed, else None."""
    for completion in output.outputs:
        if completion.finish_reason == "error":
            message = completion.error or "the constraint failed"
            return GrammarError(
                f"the request's constraint failed after {len(completion.token_ids)} tokens: "
                f"{message}"
            )
    return None


def _is_final(item: StreamItem) -> bool:
    return isinstance(item, BaseException) or item.finished


def _cause(exc: BaseException) -> BaseException:
    """What a ``StepFailedError`` wraps (the runner's own error), else ``exc``."""
    return exc.__cause__ if isinstance(exc, StepFailedError) and exc.__cause__ else exc
