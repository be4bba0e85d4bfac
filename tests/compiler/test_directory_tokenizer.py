"""A checkpoint directory's tokenizer held as ``PreTrainedTokenizerFast``: it tokenizes as the
model class ``AutoTokenizer`` loads, is kept per tokenizer files and read back from the cache,
and the copy an engine ships loads back light."""

from __future__ import annotations

import json
import string
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from llmc.compiler.frontend.directory_tokenizer import (
    TOKENIZER_FILE_MAX_BYTES,
    directory_tokenizer,
    tokenizer_dir,
)
from llmc.compiler.frontend.kept_conversion import same_tokenizer

TEXTS = ["Hello the world", "  two  spaces\tand a tab\n", "ünïcödé and 12345", "", "<bos><eos>"]


def gemma_directory(tmp_path: Path) -> Path:
    """A directory whose tokenizer ``AutoTokenizer`` loads as ``GemmaTokenizer`` (a small
    vocabulary in Gemma's form: byte fallback, "▁" for spaces, a few merges), beside a
    stand-in weights file."""
    from transformers import GemmaTokenizer

    chars = ["▁", *string.ascii_letters, *string.digits, *string.punctuation]
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a"), ("i", "n"), ("▁", "in")]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    tokens = [
        *specials,
        *(f"<0x{b:02X}>" for b in range(256)),
        *chars,
        *("".join(m) for m in merges),
    ]
    directory = tmp_path / "hf"
    GemmaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=merges).save_pretrained(
        directory
    )
    (directory / "model.safetensors").write_bytes(b"weights")
    return directory


def test_the_light_tokenizer_tokenizes_as_the_model_class(tmp_path):
    directory = gemma_directory(tmp_path)
    direct = AutoTokenizer.from_pretrained(str(directory))
    assert type(direct).__name__ == "GemmaTokenizer"  # the class the light one stands in for
    root = tmp_path / "cache"
    tokenizer = directory_tokenizer(directory, root)
    assert type(tokenizer) is PreTrainedTokenizerFast
    assert tokenizer.get_vocab() == direct.get_vocab()
    assert tokenizer.all_special_tokens == direct.all_special_tokens
    assert tokenizer.name_or_path == str(directory)
    for text in TEXTS:
        ids = direct(text).input_ids
        assert tokenizer(text).input_ids == ids
        assert tokenizer.decode(ids) == direct.decode(ids)
    # The engine's copy: the server's AutoTokenizer loads it light too.
    tokenizer.save_pretrained(tmp_path / "engine_tokenizer")
    assert type(AutoTokenizer.from_pretrained(str(tmp_path / "engine_tokenizer"))) is (
        PreTrainedTokenizerFast
    )


def test_a_second_build_reads_the_kept_copy(tmp_path):
    directory = gemma_directory(tmp_path)
    root = tmp_path / "cache"
    directory_tokenizer(directory, root)
    part = tokenizer_dir(directory, root)
    assert sorted(p.name for p in root.iterdir()) == [part.name]  # kept, no partial left
    config_path = part / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = 77  # a mark only the kept copy carries
    config_path.write_text(json.dumps(config))
    assert directory_tokenizer(directory, root).model_max_length == 77


def test_other_tokenizer_files_are_another_entry_and_weights_are_not_read(tmp_path):
    directory = gemma_directory(tmp_path)
    before = tokenizer_dir(directory, tmp_path)
    (directory / "model.safetensors").write_bytes(b"other weights")
    assert tokenizer_dir(directory, tmp_path) == before
    exported = directory / "onnx" / "model.onnx_data"  # weights under another suffix, sparse
    exported.parent.mkdir()
    with open(exported, "wb") as f:
        f.truncate(TOKENIZER_FILE_MAX_BYTES + 1)
    assert tokenizer_dir(directory, tmp_path) == before
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    config_path.write_text(json.dumps(config))
    assert tokenizer_dir(directory, tmp_path) != before


def test_a_tokenizer_with_another_chat_template_is_not_the_same(tmp_path):
    directory = gemma_directory(tmp_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    other = PreTrainedTokenizerFast.from_pretrained(str(directory))
    assert same_tokenizer(tokenizer, other)
    other.chat_template = "{{ messages[0]['content'] }}"
    assert not same_tokenizer(tokenizer, other)
