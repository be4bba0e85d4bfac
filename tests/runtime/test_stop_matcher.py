"""The stop-string automaton against the per-string search it replaced, on exact cases."""

import os
import random
import subprocess
import sys

import pytest

from llmc.runtime import output_processor
from llmc.runtime.output_processor import OutputProcessor
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.sequence import Sequence
from llmc.runtime.stop_matcher import StopMatch, StopMatcher


def reference(stops: list[str], text: str, num_old: int) -> StopMatch | None:
    """The old search: each stop string's first occurrence ending after ``text[:num_old]``; the
    earliest start wins, the first listed on a tie."""
    best = None
    for stop in stops:
        index = text.find(stop, max(num_old - len(stop) + 1, 0))
        if index >= 0 and (best is None or index < best.start):
            best = StopMatch(index, stop)
    return best


def feed_all(stops: list[str], chunks: list[str]) -> list[StopMatch | None]:
    scanner = StopMatcher(stops).scanner()
    return [scanner.feed(c) for c in chunks]


def test_a_stop_string_spanning_two_steps_is_found_when_it_ends():
    assert feed_all(["bc"], ["ab", "cd"]) == [None, StopMatch(1, "bc")]
    assert feed_all(["bcd"], ["ab", "c", "de"]) == [None, None, StopMatch(1, "bcd")]


def test_earliest_start_wins_then_the_first_listed():
    # Both end in the same step: "abcd" starts first although "bc" ends first.
    assert feed_all(["bc", "abcd"], ["abcd"]) == [StopMatch(0, "abcd")]
    # Split, "bc" ends a step before "abcd" could.
    assert feed_all(["bc", "abcd"], ["abc", "d"]) == [StopMatch(1, "bc"), StopMatch(0, "abcd")]
    assert feed_all(["ab", "abc"], ["xabc"]) == [StopMatch(1, "ab")]
    assert feed_all(["abc", "ab"], ["xabc"]) == [StopMatch(1, "abc")]
    assert feed_all(["ab", "ab", "b"], ["ab"]) == [StopMatch(0, "ab")]  # duplicates are ignored


def test_no_search_phase_walks_the_automaton_without_reporting():
    scanner = StopMatcher(["ab", "cd"]).scanner()
    assert scanner.feed("xa", search=False) is None
    assert scanner.feed("b") == StopMatch(1, "ab")  # begun before the search, found at its end
    scanner = StopMatcher(["ab"]).scanner()
    assert scanner.feed("ab", search=False) is None
    assert scanner.feed("x") is None  # it ended in the no-search phase: not reported later


def test_positions_count_characters_not_bytes():
    assert feed_all(["🙂x", "日本"], ["é🙂", "x日本"]) == [None, StopMatch(1, "🙂x")]
    assert feed_all(["日本"], ["ab🙂日", "本"]) == [None, StopMatch(3, "日本")]


def test_no_stop_strings():
    matcher = StopMatcher([])
    assert matcher.max_len == 0 and matcher.scanner().feed("anything") is None


def test_completions_of_one_matcher_keep_their_own_state():
    matcher = StopMatcher(["abc"])
    one, two = matcher.scanner(), matcher.scanner()
    assert one.feed("ab") is None
    assert two.feed("xx") is None
    assert two.feed("c") is None
    assert one.feed("c") == StopMatch(0, "abc")


@pytest.mark.parametrize("seed", range(4))
def test_random_stops_and_steps_match_the_per_string_search(seed):
    rng = random.Random(seed)
    alphabet = "ab🙂"  # few letters: many overlapping matches
    for _ in range(200):
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 5))) for _ in range(6)]
        scanner = StopMatcher(stops).scanner()
        text = ""
        for _ in range(12):
            chunk = "".join(rng.choices(alphabet, k=rng.randint(0, 4)))
            search = rng.random() < 0.7
            num_old, text = len(text), text + chunk
            expected = reference(stops, text, num_old) if search else None
            assert scanner.feed(chunk, search) == expected, (stops, text, num_old)
            if expected is not None:
                break


def test_many_stop_strings():
    rng = random.Random(0)
    stops = ["".join(rng.choices("abcdefgh", k=rng.randint(6, 12))) for _ in range(20_000)]
    text = "".join(rng.choices("abcdefgh", k=3000))
    scanner = StopMatcher(stops).scanner()
    for end in range(0, len(text), 3):
        found = scanner.feed(text[end : end + 3])
        if found is not None:
            break
    assert found == reference(stops, text[: end + 3], end)
    assert found is not None  # 20,000 strings of 6-12 letters over 3,000 letters: some occur


class CharTokenizer:
    """Token id i is the character chr(i)."""

    def decode(self, ids, **kwargs):
        return "".join(map(chr, ids))


def test_a_request_builds_its_automaton_once_for_all_its_completions(monkeypatch):
    built = []

    class CountingMatcher(StopMatcher):
        def __init__(self, stops):
            super().__init__(stops)
            built.append(stops)

    monkeypatch.setattr(output_processor, "StopMatcher", CountingMatcher)
    processor = OutputProcessor(CharTokenizer())
    parent = Sequence("r", [ord("p")], SamplingParams(n=3, stop=["yz"]))
    processor.add_request(parent)
    seqs = [parent, parent.fork(1), parent.fork(2)]
    stops = []
    for token in "xyz":
        for seq in seqs:
            seq.append_token(ord(token))
            stops.append(processor.update(seq))
    assert built == [["yz"]]
    assert stops == [None] * 6 + ["yz"] * 3


def test_texts_of_mixed_character_widths_leave_the_heap_intact(tmp_path):
    # pyahocorasick's str search corrupts the heap when ASCII and astral texts alternate (its
    # issue #221); Python's debug allocator turns that into an abort.
    script = tmp_path / "mixed.py"
    script.write_text(
        "from llmc.runtime.stop_matcher import StopMatcher\n"
        "for _ in range(200):\n"
        "    scanner = StopMatcher(['ab', '🙂x']).scanner()\n"
        "    found = [scanner.feed(t, search=False) for t in ['a', 'é🙂', 'x', 'ab', '日']]\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr[-2000:]
