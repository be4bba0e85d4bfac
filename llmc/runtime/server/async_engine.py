"""An asyncio front for the blocking, single-threaded ``LLMEngine``.

``LLMEngine`` is not thread-safe and ``step()`` is tens of milliseconds of CPU work, so it can
neither run on the event loop nor be called from many threads. ``AsyncLLMEngine`` gives it one
thread of its own. Coroutines talk to that thread through an inbox (add / abort commands, under a
condition variable); the thread applies the inbox between steps, runs ``step()`` while any
request is unfinished and sleeps on the condition when idle. Each request's outputs go back to
its coroutine through an ``asyncio.Queue`` fed with ``loop.call_soon_threadsafe``.
The design is vLLM's ``AsyncLLMEngine`` (v0) with the engine loop on a thread instead of a task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from llmc.runtime.outputs import CompletionOutput, RequestOutput
from llmc.runtime.server.errors import EngineDeadError, QueueFullError

if TYPE_CHECKING:
    from llmc.runtime.engine import LLMEngine
    from llmc.runtime.sampling_params import SamplingParams
    from llmc.runtime.stats import EngineStats

logger = logging.getLogger(__name__)

# What a request's queue carries: its outputs, or the exception that ended it.
_Item: TypeAlias = "RequestOutput | BaseException"


@dataclass
class _RequestStream:
    """Where the engine thread delivers one request's outputs: a queue on the caller's loop."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[_Item]
    last: RequestOutput | None = field(default=None)  # the latest output delivered

    def put(self, item: _Item) -> None:
        """Hand ``item`` to the request's coroutine; callable from any thread."""
        if isinstance(item, RequestOutput):
            self.last = item
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def aborted(self, add: _Add) -> RequestOutput:
        """The request's final output when the server aborts it: what it has so far, every
        unfinished completion with finish_reason "abort"."""
        if self.last is None:
            outputs = [
                CompletionOutput(index=i, text="", token_ids=[], finish_reason="abort")
                for i in range(add.params.n)
            ]
            return RequestOutput(
                self.request_id, add.prompt, add.prompt_token_ids, outputs, finished=True
            )
        outputs = [
            o if o.finish_reason else dataclasses.replace(o, finish_reason="abort")
            for o in self.last.outputs
        ]
        return dataclasses.replace(self.last, outputs=outputs, finished=True)


@dataclass(frozen=True)
class _Add:
    stream: _RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _AbortAll:
    """End every unfinished request with finish_reason "abort" (the drain's deadline)."""


_Command: TypeAlias = "_Add | _Abort | _AbortAll"


class AsyncLLMEngine:
    """Runs an ``LLMEngine`` on one background thread and streams its outputs to coroutines.

    Args:
        engine: the engine; from now on only this object's thread may touch it.
        max_waiting: how many requests may wait for their first output (queued or in prefill)
            before ``generate`` refuses new ones with ``QueueFullError``.
    """

    def __init__(self, engine: LLMEngine, max_waiting: int = 64) -> None:
        self.tokenizer = engine.tokenizer
        self.max_model_len: int = engine.max_model_len
        self.max_waiting = max_waiting
        self._engine = engine
        self._cond = threading.Condition()
        self._inbox: list[_Command] = []
        self._stopping = False
        self._dead: EngineDeadError | None = None
        self._num_waiting = 0
        self._num_in_flight = 0
        self._stats: EngineStats = engine.stats()  # replaced by the engine thread, never mutated
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
    def stats(self) -> EngineStats:
        """The engine's statistics after its latest step or abort (block pool, prefix cache,
        preemptions); a snapshot, safe to read from any thread."""
        return self._stats

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
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and yield its outputs until it finishes.

        Outputs are cumulative (``outputs[0].text`` is the whole text so far); when the consumer
        is slower than the engine, intermediate outputs are skipped (never the first). Stopping
        the iteration early (``break``, ``aclose()``, cancellation on client disconnect) aborts
        the request, which frees its KV blocks.

        Raises (before any output is yielded):
            QueueFullError: ``max_waiting`` requests are already waiting.
            EngineDeadError: the engine thread has stopped.
            ValueError: ``LLMEngine.add_request`` refused the request (message from the engine).
        """
        stream = _RequestStream(request_id, asyncio.get_running_loop(), asyncio.Queue())
        with self._cond:
            if self._dead is not None or self._stopping:
                raise self._dead or EngineDeadError("the engine is shutting down")
            if self._num_waiting >= self.max_waiting:
                raise QueueFullError(
                    f"{self._num_waiting} requests are already waiting (max_waiting="
                    f"{self.max_waiting}); retry later"
                )
            self._num_waiting += 1
            self._num_in_flight += 1
            self._inbox.append(_Add(stream, list(prompt_token_ids), params, prompt))
            self._cond.notify()
        waiting, finished = True, False
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
                    raise item
                finished = item.finished
                yield item
        finally:
            if waiting:
                self._count_started()
            with self._cond:
                self._num_in_flight -= 1
            if not finished:
                self._submit(_Abort(request_id))

    def abort_all(self) -> None:
        """End every unfinished request now: each gets a last output with what it generated so
        far and finish_reason "abort" (unless already finished), and its blocks are freed.
        Used when a drain runs out of time."""
        self._submit(_AbortAll())

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread after its current step; unfinished requests fail with
        ``EngineDeadError``. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _count_started(self) -> None:
        with self._cond:
            self._num_waiting -= 1

    def _submit(self, command: _Command) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def _run(self) -> None:
        """The engine thread: apply the inbox, step while there is work, sleep when idle."""
        streams: dict[str, tuple[_RequestStream, _Add]] = {}
        error = EngineDeadError("the engine is shut down")
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
                    outputs = self._engine.step()
                    # Before any output reaches a client, so what it then reads is this step's.
                    self._stats = self._engine.stats()
                    for output in outputs:
                        entry = streams.get(output.request_id)
                        if entry is None:  # aborted while the step ran
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
            if isinstance(command, _Add):
                command.stream.put(error)

    def _apply(self, command: _Command, streams: dict[str, tuple[_RequestStream, _Add]]) -> None:
        """Apply one inbox command on the engine thread."""
        if isinstance(command, _AbortAll):
            for request_id, (stream, add) in list(streams.items()):
                self._abort(request_id, streams)
                stream.put(stream.aborted(add))
            return
        if isinstance(command, _Abort):
            self._abort(command.request_id, streams)
            return
        stream = command.stream
        if stream.request_id in streams:
            stream.put(ValueError(f"request id {stream.request_id!r} is already in use"))
            return
        try:
            self._engine.add_request(
                stream.request_id, command.prompt_token_ids, command.params, prompt=command.prompt
            )
        except Exception as exc:  # refused (ValueError) or an engine bug: fail this request only
            stream.put(exc)
            return
        streams[stream.request_id] = (stream, command)

    def _abort(self, request_id: str, streams: dict[str, tuple[_RequestStream, _Add]]) -> None:
        if streams.pop(request_id, None) is not None:
            try:
                self._engine.abort_request(request_id)
            except Exception:  # a failed abort must not stop the other requests
                logger.exception("aborting request %s failed", request_id)


def _is_final(item: _Item) -> bool:
    return isinstance(item, BaseException) or item.finished
