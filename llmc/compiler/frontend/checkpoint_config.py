"""A checkpoint's config against its tensors, before the model is built from the config.

The build makes the model from the config (``streamed_export.meta_model``, transformers'
``from_pretrained``) and only then meets the weights: a config that says ``hidden_size:
1000000000`` over 64-wide tensors would have torch allocate terabytes first. So the config's
dimensions (``model_dims``) are checked here against the shapes in the checkpoint's headers,
and a mismatch is refused with a ``ModelSourceError`` naming the config, the tensor and the rule.

Names are those transformers' Llama-family checkpoints have (Llama, Mistral, Qwen2, Gemma 3:
``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``, ...; shapes [out, in]),
and llama.cpp's in a GGUF file (``token_embd.weight``, ``blk.N.*``; shapes [in, out], ggml's
order). A tensor of another name (a fused ``qkv_proj``, experts) is left alone; a
checkpoint of another family (none of these names) is sized by ``memory.plan`` alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from llmc.compiler.frontend.gguf_file import GgufSummary
from llmc.compiler.frontend.model_dims import ModelDims
from llmc.compiler.weights.safetensors_header import SafetensorsTensor
from llmc.errors import ModelSourceError

EMBEDDING = "model.embed_tokens.weight"
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(.+)")

# One rule: the config names whose product is each dimension of a tensor's shape.
_Rule = tuple[tuple[str, ...], ...]
_Q, _KV = ("num_attention_heads", "head_dim"), ("num_key_value_heads", "head_dim")
_H, _I = ("hidden_size",), ("intermediate_size",)
_HF_TOP: dict[str, _Rule] = {
    EMBEDDING: (("vocab_size",), _H),
    "lm_head.weight": (("vocab_size",), _H),
    "model.norm.weight": (_H,),
}
_HF_LAYER_RULES: dict[str, _Rule] = {
    "self_attn.q_proj.weight": (_Q, _H),
    "self_attn.k_proj.weight": (_KV, _H),
    "self_attn.v_proj.weight": (_KV, _H),
    "self_attn.o_proj.weight": (_H, _Q),
    "self_attn.q_proj.bias": (_Q,),
    "self_attn.k_proj.bias": (_KV,),
    "self_attn.v_proj.bias": (_KV,),
    "mlp.gate_proj.weight": (_I, _H),
    "mlp.up_proj.weight": (_I, _H),
    "mlp.down_proj.weight": (_H, _I),
    "input_layernorm.weight": (_H,),
    "post_attention_layernorm.weight": (_H,),
    "pre_feedforward_layernorm.weight": (_H,),
    "post_feedforward_layernorm.weight": (_H,),
}
_GGUF_TOP: dict[str, _Rule] = {"token_embd.weight": (_H, ("vocab_size",))}
# Per-layer GGUF shapes vary by architecture (llama.cpp fuses Phi-3's gate and up into one
# ffn_up of twice feed_forward_length): the width and the layer count are what is checked.
_GGUF_LAYER_RULES: dict[str, _Rule] = {}


def check_safetensors_config(dims: ModelDims, tensors: Mapping[str, SafetensorsTensor]) -> None:
    """Check ``dims`` (the checkpoint's config) against ``tensors`` (its checked headers,
    ``safetensors_header``): every tensor of a known name has the shape the config gives it,
    and the decoder layers present are 0 .. num_hidden_layers - 1. Raises ModelSourceError
    naming the config, the tensor and its file, and the config names of the rule."""
    layered = any(_HF_LAYER.fullmatch(name) for name in tensors)
    if not layered and EMBEDDING not in tensors:
        return  # another family's names: nothing here to hold the config to
    if EMBEDDING not in tensors:
        raise ModelSourceError(
            f"{dims.source} does not match the checkpoint: it has decoder layers "
            f"(model.layers.N.*) but no {EMBEDDING}; the checkpoint is incomplete"
        )
    shapes = {name: (t.shape, t.file) for name, t in tensors.items()}
    _check(dims, shapes, _HF_TOP, _HF_LAYER_RULES, _HF_LAYER, "model.layers.N.*")


def check_gguf_config(dims: ModelDims, summary: GgufSummary, path: Path) -> None:
    """Check ``dims`` (the GGUF file's metadata) against its tensor infos (``summary``) as
    ``check_safetensors_config`` does, shapes in ggml order. Raises ModelSourceError."""
    shapes = {t.name: (t.dims, path) for t in summary.tensors}
    _check(dims, shapes, _GGUF_TOP, _GGUF_LAYER_RULES, _GGUF_LAYER, "blk.N.*")


def _check(
    dims: ModelDims,
    shapes: Mapping[str, tuple[tuple[int, ...], Path]],
    top: Mapping[str, _Rule],
    layer_rules: Mapping[str, _Rule],
    layer_name: re.Pattern[str],
    layer_pattern: str,
) -> None:
    for name, rule in top.items():
        if name in shapes:
            _check_shape(dims, name, rule, *shapes[name])
    by_layer: dict[int, dict[str, str]] = {}  # layer -> suffix -> tensor name
    for name in shapes:
        if m := layer_name.fullmatch(name):
            by_layer.setdefault(int(m[1]), {})[m[2]] = name
    layers, expected = sorted(by_layer), dims.num_hidden_layers
    if expected is not None and layers and layers != list(range(expected)):
        raise ModelSourceError(
            f"{dims.source} does not match the checkpoint: num_hidden_layers {expected}, but "
            f"the checkpoint has layers {_ranges(layers)} ({layer_pattern})"
        )
    for layer in layers:  # in layer and rule order: the first fault a reader would find
        for suffix, rule in layer_rules.items():
            if (name := by_layer[layer].get(suffix)) is not None:
                _check_shape(dims, name, rule, *shapes[name])


def _check_shape(
    dims: ModelDims, name: str, rule: _Rule, shape: tuple[int, ...], file: Path
) -> None:
    want: list[int] = []
    for factors in rule:
        values = [getattr(dims, f) for f in factors]
        if None in values:
            return  # a dimension the config leaves open: transformers takes the tensor's
        product = 1
        for v in values:
            product *= v
        want.append(product)
    if tuple(want) != tuple(shape):
        names = dict.fromkeys(f for factors in rule for f in factors)
        given = " and ".join(f"{f} {getattr(dims, f)}" for f in names)
        raise ModelSourceError(
            f"{dims.source} does not match the checkpoint: {given} make {name} {want}, but "
            f"{file} holds it as {list(shape)}; the config and the weights must be the same "
            "model's"
        )


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
