"""Incremental detokenization with a real byte-level BPE tokenizer, and stop strings."""

import random

import pytest
from transformers import AutoTokenizer

from llmc.runtime.detokenizer import IncrementalDetokenizer
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import train_tokenizer

TEXTS = [
    "héllo wörld ✓ 日本",
    "To be, or not to be: that is the question.",
    "naïve café — 東京タワー 🙂🙂 done",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def prompt(tok):
    return tok.encode("Once more unto the breach, ")


def feed(tok, prompt, token_ids, **params):
    """Detokenize ``token_ids`` one at a time; returns the detokenizer and the text after each."""
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(**params))
    texts = []
    for t in token_ids:
        detok.update(t)
        texts.append(detok.output_text)
    return detok, texts


@pytest.mark.parametrize("text", TEXTS)
def test_text_is_emitted_as_soon_as_characters_are_complete(tok, prompt, text):
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok, texts = feed(tok, prompt, ids)
    for i, emitted in enumerate(texts):
        assert "\ufffd" not in emitted
        so_far = tok.decode(ids[: i + 1])
        if not so_far.endswith("\ufffd"):
            assert emitted == so_far
        else:  # a character is split: what is emitted is everything before it
            assert so_far.startswith(emitted) and len(emitted) < len(so_far)
    assert texts[-1] == text
    assert detok.finish() is None
    assert detok.output_text == text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_ids_decode_like_the_whole_output(tok, prompt, skip_special_tokens):
    rng = random.Random(0)
    vocab = len(tok)
    for _ in range(25):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        full = tok.decode(ids, skip_special_tokens=skip_special_tokens)
        detok, texts = feed(tok, prompt, ids, skip_special_tokens=skip_special_tokens)
        for emitted in texts:
            assert full.startswith(emitted)
        detok.finish()  # flushes what looked like an incomplete character
        assert detok.output_text == full


def test_each_step_decodes_a_short_window_not_the_whole_output(tok, prompt):
    class CountingTokenizer:
        def __init__(self):
            self.longest = 0

        def decode(self, ids, **kw):
            self.longest = max(self.longest, len(ids))
            return tok.decode(ids, **kw)

    counting = CountingTokenizer()
    ids = tok.encode(" ".join(TEXTS) * 4)
    detok, _ = feed(counting, prompt, ids)
    assert detok.output_text == " ".join(TEXTS) * 4
    assert len(ids) > 100 and counting.longest <= 10


def test_stop_string_across_token_boundaries_cuts_the_text(tok, prompt):
    text = TEXTS[1]
    ids = tok.encode(text)
    pieces = [tok.decode([t]) for t in ids]
    assert not any("not to" in p for p in pieces)  # it spans tokens
    # The stop string is complete after the first token whose prefix decodes to contain it.
    completing = next(i for i in range(len(ids)) if "not to" in tok.decode(ids[: i + 1]))
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["not to"]))
    results = [detok.update(t) for t in ids]
    assert results[completing] == "not to"
    assert all(r is None for i, r in enumerate(results) if i != completing)
    assert detok.output_text == "To be, or "
    assert detok.text(finished=True) == "To be, or "


def test_earliest_stop_string_wins_when_one_token_completes_several(tok, prompt):
    ids = tok.encode(TEXTS[1])
    assert " that" in [tok.decode([t]) for t in ids]  # one token completes "at" and "th"
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["at", "th"]))
    found = [r for r in (detok.update(t) for t in ids) if r is not None]
    assert found == ["th"]
    assert detok.output_text == "To be, or not to be: "


def test_multibyte_stop_string(tok, prompt):
    ids = tok.encode("héllo wörld ✓ 日本 and more")
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop="日本"))
    found = [r for r in (detok.update(t) for t in ids) if r is not None]
    assert found == ["日本"]
    assert detok.output_text == "héllo wörld ✓ "
    assert detok.finish() is None  # nothing more after a stop


def test_stop_string_found_when_flushing_at_the_end(tok, prompt):
    ids = tok.encode("abc ✓")[:-1]  # the last byte of ✓ never arrives
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(stop="c \ufffd"))
    assert [detok.update(t) for t in ids] == [None] * len(ids)
    assert detok.finish() == "c \ufffd"
    assert detok.output_text == "ab"


def test_unfinished_text_holds_back_a_possible_stop_string_prefix(tok, prompt):
    ids = tok.encode("the question")
    detok, _ = feed(tok, prompt, ids, stop=["quest!", "xy"])
    assert detok.output_text == "the question"
    assert detok.text(finished=False) == "the que"  # len("quest!") - 1 = 5 held back
    assert detok.text(finished=True) == "the question"
    plain, _ = feed(tok, prompt, ids)
    assert plain.text(finished=False) == "the question"
