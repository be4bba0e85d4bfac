"""Structured-output constraints compiled off the engine thread, on a small pool of workers with
a deadline (as vLLM and SGLang compile grammars asynchronously).

Compiling a grammar costs from microseconds to seconds (a choice of 40,000 strings, a large
schema) and would stall every running request if the engine thread did it between steps. Here
a request's constraint is compiled and probed (``GrammarCompiler.compile``) on a worker while
its coroutine waits; only then is the request queued, with the compiled start state. llguidance
releases the GIL while it builds a matcher, so a compile shares the cores with the engine
thread rather than stopping it.

A compile that runs past its deadline ends its request with a 400 (the constraint is too
costly); one that never got a worker before the deadline (every worker busy) gets a 503 with
Retry-After, like a full queue. A Python thread cannot be stopped: a compile past its deadline
finishes in the background, bounded by llguidance's own limits and the server's size bounds
(``RequestLimits``: constraint bytes, choices, regex repetitions), and its result is cached.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.server.errors import QueueFullError
from llmc.runtime.structured.grammar_compiler import GrammarCompiler
from llmc.runtime.structured.structured_outputs import FIELD, StructuredOutputsParams

#: How much lower the compile workers' CPU priority is than the engine's (``nice`` steps).
WORKER_NICENESS = 10


class GrammarPool:
    """Compiles constraints for one engine on ``num_workers`` threads.

    Args:
        compiler: the engine's compiler (thread-safe; its cache is shared with the engine).
        num_workers: compile threads.
        timeout_s: how long a request may wait for its constraint, seconds.

    Raises:
        ValueError: ``num_workers`` below 1 or ``timeout_s`` not positive.
    """

    def __init__(self, compiler: GrammarCompiler, num_workers: int, timeout_s: float) -> None:
        if num_workers < 1 or not timeout_s > 0:
            raise ValueError(
                f"grammar compile workers must be >= 1 and the timeout > 0 s, got "
                f"{num_workers} and {timeout_s}"
            )
        self.compiler = compiler
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(
            num_workers, thread_name_prefix="llmc-grammar", initializer=_lower_priority
        )

    async def compile(self, constraint: StructuredOutputsParams) -> Any:
        """The compiled start state of ``constraint`` (`GrammarCompiler.compile`).

        Raises:
            InvalidRequestError: (field ``structured_outputs``) the constraint is refused
                (`GrammarCompiler.compile`), or its compile ran past ``timeout_s``.
            QueueFullError: no worker was free to start it within ``timeout_s``.
        """
        started = threading.Event()

        def work() -> Any:
            started.set()
            return self.compiler.compile(constraint)

        future = asyncio.wrap_future(self._executor.submit(work))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            if not started.is_set():
                raise QueueFullError(
                    f"no grammar compile worker was free within {self.timeout_s:g} s; retry later"
                ) from None
            raise InvalidRequestError(
                f"{FIELD}.{constraint.kind()} took longer than {self.timeout_s:g} s to compile "
                "(grammar_compile_timeout, set by `llmc serve --grammar-compile-timeout`); "
                "send a smaller constraint",
                FIELD,
            ) from None

    def shutdown(self) -> None:
        """Stop the workers once idle; queued compiles are dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """Run this worker thread at a lower CPU priority (nice + `WORKER_NICENESS`; Linux sets
    it per thread), so that on a busy host the engine's threads get the cores first and a
    large compile takes longer rather than the running requests."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICENESS)
    except (AttributeError, OSError):  # not Linux, or not allowed: the default priority
        pass
