"""Export a packed-token causal LM to ONNX with one ``llmc::PagedAttention`` node per layer.

Method (DESIGN §4): ``torch.onnx.export(..., dynamo=True)`` with a custom translation table that
maps ``llmc::paged_attention`` to the plugin node. Dynamic dims: tokens T, sequences B, sampled
rows S, blocks per sequence M, and the cache's block count.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import onnx
import onnx_ir as ir
import torch

from llmc.compiler.frontend.attention import paged_attention_op
from llmc.compiler.frontend.lora_slots import attach_lora_slots
from llmc.compiler.frontend.packed_model import PackedCausalLM
from llmc.engine.graph import LOGITS, STEP_INPUTS, cache_names
from llmc.engine.kv_cache import cache_spec
from llmc.engine.lora import NO_SLOT
from llmc.engine.plugin import (
    DOMAIN,
    FPMATH_ATTRIBUTE,
    OP_TYPE,
    PLUGIN_VERSION,
    SCHEMA_VERSION,
    bind_node_call,
    with_node_signature,
)
from llmc.plugins import schema


def _translation():
    """The ONNX translation of ``llmc::paged_attention``: one ``llmc::PagedAttention`` node with
    the op's inputs and exported attributes, plus TensorRT's plugin lookup attributes."""
    import onnxscript

    llmc_opset = onnxscript.values.Opset(DOMAIN, SCHEMA_VERSION)

    def paged_attention(*args, **kwargs):
        inputs, attributes = bind_node_call(args, kwargs)
        return llmc_opset.PagedAttention(
            *inputs,
            plugin_namespace=DOMAIN,
            plugin_version=PLUGIN_VERSION,
            **attributes.exported_attributes(),
        )

    # Inputs unannotated, attributes annotated: how the exporter tells them apart.
    return with_node_signature(paged_attention)


def export_onnx(
    model: torch.nn.Module, block_size: int, lora: LoRASlots | None = None
) -> onnx.ModelProto:
    """Export ``model`` (attention already routed to llmc, weights loaded) to an ONNX
    ``ModelProto`` holding its weights (``export_ir``, serialized: under protobuf's 2 GB)."""
    return ir.to_proto(export_ir(model, block_size, lora))


@dataclass(frozen=True)
class LoRASlots:
    """The adapter slots to reserve (``--enable-lora``): N slots of rank R on the Linear
    layers named ``target_modules``."""

    max_loras: int
    max_lora_rank: int
    target_modules: tuple[str, ...]


def export_ir(model: torch.nn.Module, block_size: int, lora: LoRASlots | None = None) -> ir.Model:
    """Export ``model`` (attention already routed to llmc) to an ONNX IR model.

    Inputs: ``STEP_INPUTS`` then ``cache_names(num_layers)``, then with ``lora`` the slot
    inputs of ``llmc.engine.lora`` (``LoRALayout.input_names``); output ``logits`` [S, vocab]
    float32.
    A model on the meta device exports too (example inputs follow the parameters' device): its
    initializers then have shapes and no values, for ``checkpoint_weights.bind_initializers``.
    Raises whatever ``torch.onnx.export`` raises when the model cannot be traced, ValueError when
    ``lora`` names no Linear layer of the model.
    """
    if lora is None:
        return _export(model, block_size, None)
    layout, step = attach_lora_slots(model, lora.max_loras, lora.max_lora_rank, lora.target_modules)
    try:
        return _export(model, block_size, (layout, step))
    finally:
        step.detach()


def _export(model: torch.nn.Module, block_size: int, lora) -> ir.Model:
    schema.register_schema()
    spec = cache_spec(model)
    packed = PackedCausalLM(model, lora).eval()
    dev = next(model.parameters()).device
    num_tokens, num_seqs, max_blocks, num_blocks = 5, 2, 3, 8
    example = (
        torch.zeros(num_tokens, dtype=torch.int64, device=dev),
        torch.arange(num_tokens, dtype=torch.int64, device=dev),
        torch.tensor([2, 4], dtype=torch.int64, device=dev),
        torch.tensor([3, 2], dtype=torch.int32, device=dev),
        torch.tensor([0, 3, 5], dtype=torch.int32, device=dev),
        torch.zeros(num_seqs, max_blocks, dtype=torch.int32, device=dev),
        torch.arange(num_tokens, dtype=torch.int64, device=dev),
    )
    cache_shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    caches = tuple(
        torch.zeros(cache_shape, dtype=spec.dtype, device=dev) for _ in range(2 * spec.num_layers)
    )
    lora_inputs, lora_names = _lora_examples(lora, num_tokens, dev)
    t = torch.export.Dim("num_tokens", min=1, max=65536)
    b = torch.export.Dim("num_seqs", min=1, max=4096)
    s = torch.export.Dim("num_sampled", min=1, max=4096)
    m = torch.export.Dim("max_blocks_per_seq", min=1, max=65536)
    n = torch.export.Dim("num_blocks", min=1, max=1 << 24)
    dynamic_shapes = (
        {0: t},
        {0: t},
        {0: s},
        {0: b},
        {0: b + 1},
        {0: b, 1: m},
        {0: t},
        # *kv_caches (and the LoRA inputs after them) is one varargs entry in torch.export's
        # input structure; the slot tensors are static [K, N*R] and [N*R, O].
        tuple({0: n} for _ in caches) + (({0: t},) if lora else ()) + (None,) * len(lora_names[1:]),
    )
    with torch.no_grad(), warnings.catch_warnings():
        # Each dynamic dim is named once per input it appears in; the exporter warns for every
        # repeat ("The axis name: num_tokens will not be used ..."): noise, not a problem.
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")
        program = torch.onnx.export(
            packed,
            example + caches + lora_inputs,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=[*STEP_INPUTS, *cache_names(spec.num_layers), *lora_names],
            output_names=[LOGITS],
            custom_translation_table={paged_attention_op._opoverload: _translation()},
            opset_version=23,
            optimize=False,
            verbose=False,
        )
    # The exporter writes every attribute of the registered schema, defaults included; the CPU
    # kernel's fpmath_mode is no part of the plugin contract (TensorRT's plugin would get it as
    # an unknown field): the CPU lowering sets it where it applies.
    for node in program.model.graph:
        if node.domain == DOMAIN and node.op_type == OP_TYPE:
            node.attributes.pop(FPMATH_ATTRIBUTE, None)
    return program.model


def _lora_examples(lora, num_tokens: int, dev) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    """The LoRA inputs' example tensors and names (none without ``lora``)."""
    if lora is None:
        return (), []
    layout, _ = lora
    width = layout.slot_width
    tensors = [torch.full((num_tokens,), NO_SLOT, dtype=torch.int64, device=dev)]
    for k, o in layout.modules.values():
        tensors += [torch.zeros(k, width, device=dev), torch.zeros(width, o, device=dev)]
    return tuple(tensors), layout.input_names()
