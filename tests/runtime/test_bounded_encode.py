"""`encode_bounded`: refuses only prompts longer than the model, with the real tokenizer of the
tiny models (byte-level BPE trained on tinyshakespeare), on text cut at arbitrary places."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from llmc.errors import ContextLengthError
from llmc.runtime.server.bounded_encode import PIECE_CHARS, encode_bounded
from tests.tiny_models import train_tokenizer

SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(out)
    return AutoTokenizer.from_pretrained(out)


def _calls(tokenizer, text: str, max_model_len: int) -> tuple[list[int], int]:
    counted: list[int] = []

    def count(piece: str) -> int:
        counted.append(len(piece))
        return len(tokenizer.encode(piece, add_special_tokens=False))

    ids = encode_bounded(tokenizer.encode, count, text, max_model_len)
    return ids, sum(counted)


@pytest.mark.parametrize("offset", [0, 7, 5003, 12345])
def test_a_prompt_that_fits_is_encoded_exactly(tokenizer, offset: int) -> None:
    text = SHAKESPEARE.read_text()[offset : offset + 5 * PIECE_CHARS + 321]
    exact = tokenizer.encode(text)
    # The limit at exactly the prompt's length: the pieces must not refuse it.
    ids, _ = _calls(tokenizer, text, max_model_len=len(exact))
    assert ids == exact


def test_a_short_prompt_is_encoded_whole_without_counting(tokenizer) -> None:
    text = SHAKESPEARE.read_text()[:PIECE_CHARS]
    ids, counted_chars = _calls(tokenizer, text, max_model_len=8)
    assert ids == tokenizer.encode(text) and counted_chars == 0


def test_a_huge_prompt_is_refused_after_a_prefix(tokenizer) -> None:
    text = SHAKESPEARE.read_text() * 4  # ~4.4 MB, about a million tokens
    counted: list[int] = []

    def count(piece: str) -> int:
        counted.append(len(piece))
        return len(tokenizer.encode(piece, add_special_tokens=False))

    with pytest.raises(ContextLengthError) as info:
        encode_bounded(tokenizer.encode, count, text, max_model_len=2048)
    assert info.value.limit == 2048 and info.value.num_tokens > 2 * 2048
    assert "maximum context length is 2048 tokens" in str(info.value)
    assert sum(counted) < len(text) // 20  # stopped long before the end
