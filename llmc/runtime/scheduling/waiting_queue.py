"""The sequences waiting for a slot, and the order in which they get one (after vLLM v1's
``request_queue.py``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from llmc.runtime.sequence import Sequence


class WaitingQueue:
    """Two FIFO queues: requests' first completions (index 0), and the completions 1..n-1
    forked from them. Forks go first, but only while fewer than a cap of them run; a fork held
    back by the cap does not hold back the first completions behind it, and is not scanned past
    at every step (two queues make `peek` O(1), finished sequences aside).

    Finished (aborted) sequences stay in a queue until they reach its front: no O(n) removal.
    """

    def __init__(self) -> None:
        self.firsts: deque[Sequence] = deque()
        self.forks: deque[Sequence] = deque()

    def __iter__(self) -> Iterator[Sequence]:
        """Forks then first completions, each queue from its front (finished ones included)."""
        yield from self.forks
        yield from self.firsts

    def __bool__(self) -> bool:
        return bool(self.forks or self.firsts)

    def add_request(self, seq: Sequence) -> None:
        """A new request, at the back."""
        self.firsts.append(seq)

    def add_forks(self, forks: Iterable[Sequence]) -> None:
        """New completions of a request that just forked, at the back of the forks."""
        self.forks.extend(forks)

    def requeue(self, seq: Sequence) -> None:
        """A preempted sequence, at the front of its queue (it goes first among its kind)."""
        (self.forks if seq.index > 0 else self.firsts).appendleft(seq)

    def peek(self, forks_allowed: bool) -> Sequence | None:
        """The sequence to admit next: the oldest waiting fork if ``forks_allowed``, else (or if
        there is none) the oldest first completion; None if none waits. Drops the finished
        sequences it meets. The caller admits it with `pop` or leaves it at the front."""
        for queue in (self.forks, self.firsts) if forks_allowed else (self.firsts,):
            while queue and queue[0].is_finished:
                queue.popleft()
            if queue:
                return queue[0]
        return None

    def pop(self, seq: Sequence) -> None:
        """Remove ``seq``, which `peek` just returned, from the front of its queue."""
        (self.forks if seq.index > 0 else self.firsts).popleft()
