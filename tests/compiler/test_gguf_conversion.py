"""The GGUF conversion cache: the config and tokenizer read back from it are transformers'
conversion of the file; one that does not load back the same is not kept; a file with other
bytes is another entry."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

from llmc.compiler.frontend.gguf_conversion import conversion_dir, gguf_config, gguf_tokenizer
from llmc.compiler.frontend.model_source import sha256_files
from tests.compiler.test_gguf_streaming import write_tiny_gguf

TEXTS = ["Hello world", "  two  spaces\tand a tab\n", "ünïcödé and 12345", ""]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_cached_conversion_is_transformers_conversion(family, tmp_path):
    path = write_tiny_gguf(tmp_path / "model.gguf", family)
    digest = sha256_files([path])
    root = tmp_path / "gguf"
    direct_config = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    direct_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for _ in range(2):  # converted and kept, then read back
        config = gguf_config(tmp_path, path.name, digest, root)
        tokenizer = gguf_tokenizer(tmp_path, path.name, digest, root)
        assert config.to_dict() == direct_config.to_dict()
        assert type(config) is type(direct_config)
        assert tokenizer.get_vocab() == direct_tokenizer.get_vocab()
        assert tokenizer.all_special_tokens == direct_tokenizer.all_special_tokens
        assert tokenizer.name_or_path == direct_tokenizer.name_or_path
        for text in TEXTS:
            assert tokenizer(text).input_ids == direct_tokenizer(text).input_ids
            ids = direct_tokenizer(text).input_ids
            assert tokenizer.decode(ids) == direct_tokenizer.decode(ids)
        # Read back as the generic fast tokenizer (tokenizers' serialization), not the model's
        # class, which keeps Python copies of the vocabulary and merges.
        assert type(tokenizer) is PreTrainedTokenizerFast
    kept = sorted(p.name for p in conversion_dir(digest, root).iterdir())
    # Both kept: the tiny Gemma 3's byte-level BPE vocabulary does not load back in Gemma's
    # tokenizer class (transformers rebuilds it without an unknown token), but does as the
    # serialized pipeline.
    assert kept == ["config", "tokenizer"]


def test_a_file_with_other_bytes_is_another_entry(tmp_path):
    first = write_tiny_gguf(tmp_path / "a" / "model.gguf", "llama", seed=0)
    second = write_tiny_gguf(tmp_path / "b" / "model.gguf", "llama", seed=1)
    digests = [sha256_files([first]), sha256_files([second])]
    assert digests[0] != digests[1]
    assert conversion_dir(digests[0]) != conversion_dir(digests[1])
    root = tmp_path / "gguf"
    for path, digest in zip((first, second), digests, strict=True):
        gguf_config(path.parent, path.name, digest, root)
    assert len(list(root.iterdir())) == 2
