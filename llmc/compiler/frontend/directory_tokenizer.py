"""A checkpoint directory's tokenizer held as ``PreTrainedTokenizerFast``, kept per tokenizer
files.

``AutoTokenizer`` loads a directory's tokenizer in the model's class (``GemmaTokenizer``,
``LlamaTokenizer``, ...), which in transformers 5 keeps Python copies of the vocabulary and
merges it rebuilds the ``tokenizers`` pipeline from: for Gemma 3's 262,144 tokens 0.48 GB
resident and 6.1 s to load, against 0.12 GB and 3.2 s for ``PreTrainedTokenizerFast`` on the
same files (2-core AMD host, transformers 5.25). The build holds its tokenizer for its whole
run, and the engine ships a copy that every server process loads.

So the first build of a directory converts once: the model class's tokenizer is saved under
``cache_home()/tokenizer/KEY`` and kept when it reads back as ``PreTrainedTokenizerFast`` that
tokenizes the same (``kept_conversion.same_tokenizer``); KEY is a SHA-256 of the directory's
tokenizer files (every file but the weights: ``TOKENIZER_FILES_EXCLUDED``, and any file past
``TOKENIZER_FILE_MAX_BYTES``) and the converting packages' versions. Builds after it read the
kept copy, and the engine's ``tokenizer/`` is its files (``tokenizer_class:
TokenizersBackend``), so ``llmc serve`` loads the light one too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from llmc.cache_home import cache_home
from llmc.compiler.frontend.kept_conversion import kept, package_versions, same_tokenizer

#: Suffixes of the files a directory's tokenizer key leaves out: weights, never read by a
#: tokenizer, and large.
TOKENIZER_FILES_EXCLUDED = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".onnx",
    ".data",
    ".h5",
    ".msgpack",
)


#: The largest file the key reads (bytes): Gemma 3's tokenizer.json, the largest seen, is 33 MB.
TOKENIZER_FILE_MAX_BYTES = 512 << 20


def directory_tokenizer(directory: Path, root: Path | None = None) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(directory)`` gives, held as
    ``PreTrainedTokenizerFast`` from the cache (``root``, default ``cache_home() / "tokenizer"``)
    when these tokenizer files were converted before, else loaded, converted and kept there (the
    model class's own when its conversion does not tokenize the same). Raises what transformers
    raises for a directory without a tokenizer; OSError when the cache cannot be written."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    def convert() -> Any:
        return AutoTokenizer.from_pretrained(str(directory))

    part = tokenizer_dir(directory, root)
    return kept(convert, part, same_tokenizer, PreTrainedTokenizerFast, str(directory))


def tokenizer_dir(directory: Path, root: Path | None = None) -> Path:
    """``root / KEY`` (``root`` default ``cache_home() / "tokenizer"``): KEY the SHA-256 of the
    names and bytes of ``directory``'s files (top level and one level down, weights left out:
    ``TOKENIZER_FILES_EXCLUDED``) and the converting packages' versions."""
    root = cache_home() / "tokenizer" if root is None else root
    digest = hashlib.sha256("\0".join(package_versions()).encode())
    for path in _tokenizer_files(Path(directory)):
        digest.update(f"\0{path.relative_to(directory).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return root / digest.hexdigest()


def _tokenizer_files(directory: Path) -> list[Path]:
    """``directory``'s files that can hold tokenizer data, sorted: every file at the top level
    and in its subdirectories (``additional_chat_templates/``) but weights, by suffix or by a
    size no tokenizer file has (``TOKENIZER_FILE_MAX_BYTES``: an ``onnx/model.onnx_data``)."""
    files = [*directory.glob("*"), *directory.glob("*/*")]
    return sorted(
        p
        for p in files
        if p.is_file()
        and p.suffix not in TOKENIZER_FILES_EXCLUDED
        and p.stat().st_size <= TOKENIZER_FILE_MAX_BYTES
    )
