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
concurrent build never reads half of one.

A kept tokenizer is read back as ``PreTrainedTokenizerFast``: ``tokenizers``' own serialization
of the converted pipeline, without the model class's Python copies of the vocabulary and merges
that it rebuilds the pipeline from. For Gemma 3's 262,144 tokens that is 0.12 GB resident
against 0.48 GB for ``GemmaTokenizer`` (2-core AMD host, transformers 5.25), held by the build
for its whole run and by the server that loads the engine's copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from llmc.cache_home import cache_home

#: The packages whose code converts the metadata.
CONVERTING_PACKAGES = ("transformers", "tokenizers")


def gguf_tokenizer(directory: Path, gguf_file: str, digest: str, root: Path | None = None) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)`` gives,
    read from the conversion cache (``root``, default ``cache_home() / "gguf"``) when the file of
    sha256 ``digest`` was converted before, else converted and kept there. Raises what
    transformers raises for a file it cannot convert; OSError when the cache cannot be written."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    part = conversion_dir(digest, root) / "tokenizer"
    return _converted(
        AutoTokenizer, directory, gguf_file, part, _same_tokenizer, PreTrainedTokenizerFast
    )


def gguf_config(directory: Path, gguf_file: str, digest: str, root: Path | None = None) -> Any:
    """The config ``AutoConfig.from_pretrained(directory, gguf_file=gguf_file)`` gives, cached as
    ``gguf_tokenizer`` caches the tokenizer."""
    from transformers import AutoConfig

    part = conversion_dir(digest, root) / "config"
    return _converted(AutoConfig, directory, gguf_file, part, _same_config)


def conversion_dir(digest: str, root: Path | None = None) -> Path:
    """``root / KEY`` (``root`` default ``cache_home() / "gguf"``): KEY the SHA-256 of the GGUF
    file's ``digest`` and the versions of ``CONVERTING_PACKAGES``."""
    root = cache_home() / "gguf" if root is None else root
    versions = [f"{name}=={metadata.version(name)}" for name in CONVERTING_PACKAGES]
    return root / hashlib.sha256("\0".join([digest, *versions]).encode()).hexdigest()


def _converted(
    auto: Any,
    directory: Path,
    gguf_file: str,
    part: Path,
    agree: Callable[[Any, Any], bool],
    reader: Any = None,
) -> Any:
    """``reader.from_pretrained(part)`` (``reader``, default ``auto``: ``AutoConfig``,
    ``AutoTokenizer`` or a class) when ``part`` was kept; else the conversion
    ``auto.from_pretrained(directory, gguf_file=...)``, kept in ``part`` for the next build when
    what ``reader`` loads back from its ``save_pretrained`` files ``agree``s with it, and then
    read back from there. A conversion that does not load back the same is returned and not
    kept: the next build converts it again. Either way the result is named after
    ``directory``, as the file's own load is."""
    reader = auto if reader is None else reader
    if part.is_dir():
        result = reader.from_pretrained(str(part))
    else:
        result = auto.from_pretrained(str(directory), gguf_file=gguf_file)
        converted = result
        if _keep(result, part, lambda path: agree(converted, reader.from_pretrained(str(path)))):
            del result, converted
            result = reader.from_pretrained(str(part))
    result.name_or_path = str(directory)
    return result


def _keep(converted: Any, part: Path, loads_back: Callable[[Path], bool]) -> bool:
    """Save ``converted`` to ``part`` under a temporary name, renamed into place when
    ``loads_back`` says its files give it back; removed otherwise. Returns whether ``part``
    holds a kept copy (this one, or another build's renamed first)."""
    partial = part.with_name(f"{part.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    converted.save_pretrained(str(partial))
    if not loads_back(partial):
        shutil.rmtree(partial, ignore_errors=True)
        return False
    try:
        os.replace(partial, part)
    except OSError:  # another build renamed its copy first: keep that one
        shutil.rmtree(partial, ignore_errors=True)
    return part.is_dir()


#: Texts both tokenizers must encode alike: words, runs of spaces, tabs and newlines, digits,
#: accents, code, and every special token.
_PROBES = ("The capital of France is", "  two  spaces\tand a tab\n\n", "ünïcödé 12345", "def f(x):")


def _same_tokenizer(converted: Any, read: Any) -> bool:
    """Whether ``read`` tokenizes as ``converted``: the same vocabulary, special tokens and
    chat template, and the same ids and decoded text for ``_PROBES`` and the special tokens
    (``read`` may be another class: ``PreTrainedTokenizerFast``)."""
    if read.get_vocab() != converted.get_vocab():
        return False
    if read.all_special_tokens != converted.all_special_tokens:
        return False
    if read.chat_template != converted.chat_template:
        return False
    texts = [*_PROBES, " ".join(converted.all_special_tokens)]
    try:
        ids = [read(text).input_ids for text in texts]
        decoded = [read.decode(i) for i in ids]
    except Exception:  # noqa: BLE001 - any failure of the reloaded tokenizer means "not the same"
        return False
    return ids == [converted(t).input_ids for t in texts] and decoded == [
        converted.decode(i) for i in ids
    ]


def _same_config(converted: Any, read: Any) -> bool:
    """Whether ``read`` is ``converted``: the same class and fields but the directory's name."""

    def fields(config: Any) -> dict:
        return {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}

    return type(read) is type(converted) and fields(read) == fields(converted)
