"""A model's dimensions as its config gives them: what the build will build the model from, read
before any weight is.

An HF checkpoint directory's config is ``config.json`` as transformers' ``AutoConfig`` reads it
(the config ``from_pretrained`` and ``streamed_export.meta_model`` build the model from, its
defaults filled in; a multimodal config's text model); a GGUF file's is its metadata, by
llama.cpp's keys (``{arch}.embedding_length`` ..., ``gguf_file.check_gguf`` reads them), the
vocabulary from the embedding's shape. ``checkpoint_config`` checks them against the tensors,
``memory.plan`` sizes the model they describe, ``BuildConfig.for_model`` bounds
``--max-seq-len`` by ``max_position_embeddings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from llmc.compiler.frontend.gguf_file import GgufSummary
from llmc.errors import ModelSourceError

# GGUF metadata key (after "{arch}.") of each dimension (llama.cpp ``gguf-py/gguf/constants.py``).
_GGUF_KEYS = {
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "max_position_embeddings": "context_length",
}
#: More decoder layers than any model has (the deepest have a few hundred): a config past it is
#: refused as damaged, before anything is sized or built layer by layer from it.
MAX_LAYERS = 10_000


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a decoder-only model, by transformers' config names; None where the
    config does not give one (or gives a per-layer list).

    Attributes:
        source: where they were read (the ``config.json`` path, or the GGUF file's metadata).
        hidden_size: the residual stream's width.
        vocab_size: tokens of the embedding and the vocabulary projection.
        intermediate_size: the MLP's inner width.
        num_hidden_layers: decoder layers.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (GQA, MQA).
        head_dim: width of one head.
        max_position_embeddings: the positions the model was trained on.
        tie_word_embeddings: the vocabulary projection shares the embedding's table.
    """

    source: str
    hidden_size: int | None = None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False

    @classmethod
    def of(cls, source: str, values: Mapping[str, object], tied: bool) -> ModelDims:
        """Dims from ``values`` (config name -> value), missing heads derived as transformers
        derives them (KV heads: the query heads; head_dim: hidden_size / heads). A list (a
        per-layer dimension) reads as unknown. Raises ModelSourceError naming ``source`` and
        the key whose value is not a positive integer, or more layers than ``MAX_LAYERS``."""
        dims: dict[str, int | None] = {}
        for name in _DIM_NAMES:
            value = values.get(name)
            if value is None or isinstance(value, list | tuple):
                dims[name] = None
            elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
                dims[name] = value
            else:
                raise ModelSourceError(
                    f"{source}: {name} {value!r} is not a positive integer; the config is "
                    "damaged: download or convert the checkpoint again"
                )
        if (dims["num_hidden_layers"] or 0) > MAX_LAYERS:
            raise ModelSourceError(
                f"{source}: num_hidden_layers {dims['num_hidden_layers']} is more than any "
                f"model has (at most {MAX_LAYERS}); the config is damaged"
            )
        if dims["num_key_value_heads"] is None:
            dims["num_key_value_heads"] = dims["num_attention_heads"]
        hidden, heads = dims["hidden_size"], dims["num_attention_heads"]
        if dims["head_dim"] is None and hidden is not None and heads is not None:
            dims["head_dim"] = hidden // heads
        return cls(source, **dims, tie_word_embeddings=tied)

    def describe(self) -> str:
        """The known dimensions as ``name value`` pairs, for messages."""
        return ", ".join(f"{n} {getattr(self, n)}" for n in _DIM_NAMES if getattr(self, n))

    def implied_tensors(self) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
        """The weights of a Llama-shaped decoder of these dims as (name, [out, in] shape), by
        transformers' names (norms left out: they are 1-D and small); None when a dimension is
        unknown. What the config makes the build hold, whatever the checkpoint's tensors are."""
        h, v, i, n = self.hidden_size, self.vocab_size, self.intermediate_size, self.head_dim
        heads, kv_heads, layers = (
            self.num_attention_heads,
            self.num_key_value_heads,
            self.num_hidden_layers,
        )
        if None in (h, v, i, n, heads, kv_heads, layers):
            return None
        q, kv = heads * n, kv_heads * n
        per_layer = {
            "self_attn.q_proj": (q, h),
            "self_attn.k_proj": (kv, h),
            "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q),
            "mlp.gate_proj": (i, h),
            "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i),
        }
        tensors = [("model.embed_tokens.weight", (v, h))]
        if not self.tie_word_embeddings:
            tensors.append(("lm_head.weight", (v, h)))
        for layer in range(layers):
            tensors += [(f"model.layers.{layer}.{m}.weight", s) for m, s in per_layer.items()]
        return tuple(tensors)


# The dimensions: every field but ``source`` and ``tie_word_embeddings``.
_DIM_NAMES = tuple(f.name for f in fields(ModelDims) if f.type == "int | None")


def read_config_dims(directory: Path) -> ModelDims:
    """The dims of the HF checkpoint in ``directory`` (its ``config.json``, as ``AutoConfig``
    reads it). Raises ModelSourceError when transformers cannot read the config or a dimension
    is not a positive integer."""
    from transformers import AutoConfig

    path = directory / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(directory))
        text = config.get_text_config()
    except Exception as e:  # a config class raises what its values make it (ZeroDivisionError...)
        raise ModelSourceError(
            f"{path} cannot be read as a transformers config ({type(e).__name__}: {e}); fix "
            "the config or download the checkpoint again"
        ) from e
    values = {name: getattr(text, name, None) for name in _DIM_NAMES}
    tied = bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    return ModelDims.of(str(path), values, tied)


def gguf_dims(path: Path, summary: GgufSummary) -> ModelDims:
    """The dims the metadata of the GGUF file ``path`` (``summary``: its checked header) gives;
    the vocabulary is the embedding's (``token_embd.weight``, ggml order [hidden, vocab]).
    Raises ModelSourceError for a dimension that is not a positive integer."""
    arch = summary.architecture
    metadata = summary.metadata if arch is not None else {}
    values: dict[str, object] = {
        name: metadata.get(f"{arch}.{key}") for name, key in _GGUF_KEYS.items()
    }
    names = {t.name: t.dims for t in summary.tensors}
    embedding = names.get("token_embd.weight", ())
    values["vocab_size"] = embedding[1] if len(embedding) == 2 else None
    return ModelDims.of(f"{path} (GGUF metadata)", values, "output.weight" not in names)
