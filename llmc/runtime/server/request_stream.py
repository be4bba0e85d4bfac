"""One request's channel between the engine thread and its coroutine (`RequestStream`), the
commands coroutines send the engine thread, and how a request ended (`finish_outcome`)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from llmc.runtime.outputs import CompletionOutput, RequestOutput

if TYPE_CHECKING:
    from concurrent.futures import Future

    from llmc.runtime.lora.lora_request import LoRARequest
    from llmc.runtime.sampling_params import SamplingParams

# What a request's queue carries: its outputs, or the exception that ended it.
StreamItem: TypeAlias = "RequestOutput | BaseException"

#: How a request the engine accepted can end (vLLM's ``finished_reason`` values): its
#: completions' finish reason, "abort" (cancelled: client gone, drain deadline) or "error"
#: (its step failed, its constraint failed, or the engine stopped).
FINISH_OUTCOMES = ("stop", "length", "abort", "error")


@dataclass
class RequestStream:
    """Where the engine thread delivers one request's outputs: a queue on the caller's loop."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[StreamItem]
    last: RequestOutput | None = field(default=None)  # the latest output delivered

    def put(self, item: StreamItem) -> None:
        """Hand ``item`` to the request's coroutine; callable from any thread."""
        if isinstance(item, RequestOutput):
            self.last = item
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def aborted(self, add: Add) -> RequestOutput:
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
class Add:
    """Start a request; its outputs go to ``stream``."""

    stream: RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    grammar: object = None  # the compiled start state of params.structured_outputs, or None
    lora_request: LoRARequest | None = None  # the adapter that serves it, None: the base model


@dataclass(frozen=True)
class LoRAChange:
    """Load an adapter (a ``LoRARequest``) or unload one (its name) on the engine thread,
    between steps; the outcome (None or the error) is set on ``done``."""

    change: LoRARequest | str
    done: Future


@dataclass(frozen=True)
class Abort:
    """End one request and free its blocks (its coroutine stopped listening)."""

    request_id: str


@dataclass(frozen=True)
class AbortAll:
    """End every unfinished request with finish_reason "abort" (the drain's deadline)."""


Command: TypeAlias = "Add | Abort | AbortAll | LoRAChange"


def finish_outcome(output: RequestOutput) -> str:
    """A finished request's outcome: "error" if any completion failed, "abort" if any was
    aborted (a request ends once, with all its completions), else its first completion's
    finish reason."""
    reasons = [o.finish_reason for o in output.outputs]
    if "error" in reasons:
        return "error"
    if "abort" in reasons or not reasons or not reasons[0]:
        return "abort"
    return reasons[0]
