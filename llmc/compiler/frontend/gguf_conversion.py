"""The config and tokenizer transformers converts from a GGUF file's metadata, kept as a Hugging
Face directory per file.

transformers reads a GGUF file's metadata with the ``gguf`` package's reader, one NumPy view per
array element: Gemma 3 270M's 262,144-token vocabulary takes 40-60 s on a 2-core host, once for
the tokenizer and once more for the config, in every build of the file. The conversion is a
function of the file's bytes and of transformers and tokenizers, so it is kept under
``cache_home()/gguf/KEY`` (``config/``, ``tokenizer/``: ``save_pretrained``'s files, the same files
an engine directory carries) with KEY a SHA-256 of the file's digest and both versions. A build
of a file converted before reads them back (Gemma 3 270M, 2-core host: the build's "resolve
model" 8 s against 81 s, "load weights" 3 s against 65 s). A part is
kept only when it loads back the same (config fields; tokenizer vocabulary, special tokens, chat
template and the ids of probe texts), under a temporary name renamed when complete, so a
concurrent build never reads half of one (``kept_conversion``).

A kept tokenizer is read back as ``PreTrainedTokenizerFast``: ``tokenizers``' own serialization
of the converted pipeline, without the model class's Python copies of the vocabulary and merges
that it rebuilds the pipeline from. For Gemma 3's 262,144 tokens that is 0.12 GB resident
against 0.48 GB for ``GemmaTokenizer`` (2-core AMD host, transformers 5.25), held by the build
for its whole run and by the server that loads the engine's copy.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from llmc.cache_home import cache_home
from llmc.compiler.frontend.kept_conversion import kept, package_versions, same_tokenizer


def gguf_tokenizer(directory: Path, gguf_file: str, digest: str, root: Path | None = None) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)`` gives,
    read from the conversion cache (``root``, default ``cache_home() / "gguf"``) when the file of
    sha256 ``digest`` was converted before, else converted and kept there. Raises what
    transformers raises for a file it cannot convert; OSError when the cache cannot be written."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    def convert() -> Any:
        return AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)

    part = conversion_dir(digest, root) / "tokenizer"
    return kept(convert, part, same_tokenizer, PreTrainedTokenizerFast, str(directory))


def gguf_config(directory: Path, gguf_file: str, digest: str, root: Path | None = None) -> Any:
    """The config ``AutoConfig.from_pretrained(directory, gguf_file=gguf_file)`` gives, cached as
    ``gguf_tokenizer`` caches the tokenizer."""
    from transformers import AutoConfig

    def convert() -> Any:
        return AutoConfig.from_pretrained(str(directory), gguf_file=gguf_file)

    part = conversion_dir(digest, root) / "config"
    return kept(convert, part, _same_config, AutoConfig, str(directory))


def conversion_dir(digest: str, root: Path | None = None) -> Path:
    """``root / KEY`` (``root`` default ``cache_home() / "gguf"``): KEY the SHA-256 of the GGUF
    file's ``digest`` and the versions of the converting packages (``package_versions``)."""
    root = cache_home() / "gguf" if root is None else root
    return root / hashlib.sha256("\0".join([digest, *package_versions()]).encode()).hexdigest()


def _same_config(converted: Any, read: Any) -> bool:
    """Whether ``read`` is ``converted``: the same class and fields but the directory's name."""

    def fields(config: Any) -> dict:
        return {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}

    return type(read) is type(converted) and fields(read) == fields(converted)
