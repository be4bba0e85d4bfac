"""A conversion transformers makes, kept on disk when it loads back the same.

A build's tokenizer and config come from transformers, which converts them from what a
checkpoint carries: a GGUF file's metadata (``gguf_conversion``) or a model tokenizer class
rebuilt from a directory's files (``directory_tokenizer``). ``kept`` saves a conversion with
``save_pretrained`` under a temporary name, reads it back (possibly as a lighter class: a
tokenizer as ``PreTrainedTokenizerFast``) and renames it into place only when what it reads
back agrees with the conversion (``same_tokenizer``, or a config's fields), so a concurrent
build never reads half of one and a conversion that does not load back the same is used once
and not kept. Later builds read the kept copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

#: The packages whose code converts: their versions are part of every cache key.
CONVERTING_PACKAGES = ("transformers", "tokenizers")


def package_versions() -> list[str]:
    """``name==version`` of each of ``CONVERTING_PACKAGES``."""
    return [f"{name}=={metadata.version(name)}" for name in CONVERTING_PACKAGES]


def kept(
    convert: Callable[[], Any],
    part: Path,
    agree: Callable[[Any, Any], bool],
    reader: Any,
    name: str,
) -> Any:
    """``reader.from_pretrained(part)`` when ``part`` was kept; else ``convert()``, kept in
    ``part`` for the next build when what ``reader`` loads back from its ``save_pretrained``
    files ``agree``s with it, and then read back from there. A conversion that does not load
    back the same is returned and not kept: the next build converts it again. Either way the
    result's ``name_or_path`` is ``name``, as a direct load's is. Raises what ``convert``
    raises; OSError when ``part``'s directory cannot be written."""
    if part.is_dir():
        result = reader.from_pretrained(str(part))
    else:
        result = convert()
        converted = result
        if _keep(result, part, lambda path: agree(converted, reader.from_pretrained(str(path)))):
            del result, converted
            result = reader.from_pretrained(str(part))
    result.name_or_path = name
    return result


def _keep(converted: Any, part: Path, loads_back: Callable[[Path], bool]) -> bool:
    """Save ``converted`` to ``part`` under a temporary name, renamed into place when
    ``loads_back`` says its files give it back; removed otherwise. Returns whether ``part``
    holds a kept copy (this one, or another build's renamed first)."""
    part.parent.mkdir(parents=True, exist_ok=True)
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


def same_tokenizer(converted: Any, read: Any) -> bool:
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
