"""Stop-string matching in O(new text) per step, however many stop strings a request has.

A request's stop strings become one Aho-Corasick automaton (Aho and Corasick 1975, "Efficient
string matching: an aid to bibliographic search"): a trie of the strings with failure links (the
longest proper suffix of a node's string that is also a trie node) and dictionary links (the
nearest suffix node where a stop string ends). It is built once per request and shared by its n
completions; each completion walks it with its own state, which carries over from one step's text
to the next, so a stop string that spans steps (or tokens) is found when its last character
arrives. A step costs amortized O(1) transitions per new character plus one per match reported,
not one ``str.find`` per stop string: with 100,000 stop strings the search loop it replaces took
about 40 ms per step and per completion on the engine thread, while every other request waited
(benchmarks/bench_starvation.py).

Our own code rather than pyahocorasick: its text-chunk API corrupts the heap when successive
inputs differ in character width (its issue #221, open), a crash no request may cause; and the
server bounds the stop strings (`RequestLimits`: 16 of at most 256 characters), so building in
Python costs little.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """A stop string found in a completion's text.

    Attributes:
        start: index in the text (characters since the first one fed) of its first character.
        stop: the stop string.
    """

    start: int
    stop: str


class StopMatcher:
    """The automaton of one request's stop strings; immutable once built, shared by its
    completions.

    Building costs time and memory linear in the total length of the stop strings; bounding that
    is the request validation's job (`RequestLimits`).

    Args:
        stops: the request's stop strings, none empty; duplicates are ignored.
    """

    def __init__(self, stops: list[str]) -> None:
        # Ties (two matches starting at the same character) go to the one listed first.
        self.stops = list(dict.fromkeys(stops))
        self.max_len = max(map(len, self.stops), default=0)
        # Node 0 is the root. goto[n]: character -> child; ends[n]: index of the stop string
        # spelled by node n, or None.
        self.goto: list[dict[str, int]] = [{}]
        self.ends: list[int | None] = [None]
        for i, stop in enumerate(self.stops):
            node = 0
            for ch in stop:
                child = self.goto[node].get(ch)
                if child is None:
                    child = len(self.goto)
                    self.goto[node][ch] = child
                    self.goto.append({})
                    self.ends.append(None)
                node = child
            self.ends[node] = i
        self.fail = [0] * len(self.goto)
        self.link: list[int | None] = [None] * len(self.goto)  # dictionary (output) links
        queue = deque(self.goto[0].values())  # depth 1: fail to the root, no link
        while queue:
            node = queue.popleft()
            for ch, child in self.goto[node].items():
                f = self.fail[node]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                suffix = self.goto[f].get(ch, 0)
                self.fail[child] = suffix
                self.link[child] = suffix if self.ends[suffix] is not None else self.link[suffix]
                queue.append(child)

    def scanner(self) -> StopScanner:
        """A new search state for one completion, at the start of its text."""
        return StopScanner(self)


class StopScanner:
    """One completion's position in its request's `StopMatcher` automaton.

    Feed it the completion's text in order, each character once (`feed`); it reports the stop
    strings that the fed characters complete. Made by `StopMatcher.scanner`.
    """

    def __init__(self, matcher: StopMatcher) -> None:
        self._m = matcher
        self._state = 0
        self._pos = 0  # characters fed so far

    def feed(self, new_text: str, search: bool = True) -> StopMatch | None:
        """Append ``new_text`` to the text seen so far.

        Args:
            new_text: the characters that follow those fed before.
            search: False walks the automaton without reporting (the ``min_tokens`` phase), so
                that a stop string begun then is still found when it ends later.

        Returns:
            Among the stop strings that end inside ``new_text`` (they may begin before it), the
            one that starts first (the first listed on a tie); None if there is none or
            ``search`` is False.
        """
        m = self._m
        if not m.stops:
            return None
        goto, fail, ends, link, stops = m.goto, m.fail, m.ends, m.link, m.stops
        state, pos = self._state, self._pos
        best: tuple[int, int] | None = None  # (start, index in stops)
        for ch in new_text:
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            if search:
                node = state if ends[state] is not None else link[state]
                while node is not None:
                    i = ends[node]
                    key = (pos - len(stops[i]) + 1, i)
                    if best is None or key < best:
                        best = key
                    node = link[node]
            pos += 1
        self._state, self._pos = state, pos
        if best is None:
            return None
        return StopMatch(best[0], stops[best[1]])
