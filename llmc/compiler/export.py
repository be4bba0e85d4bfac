"""Export a packed-token causal LM to ONNX with one ``llmc::PagedAttention`` node per layer.

Method (DESIGN §4): ``torch.onnx.export(..., dynamo=True)`` with a custom translation table that
maps ``llmc::paged_attention`` to the plugin node. Dynamic dims: tokens T, sequences B, sampled
rows S, blocks per sequence M, and the cache's block count.
"""

from __future__ import annotations

import warnings

import onnx
import torch

from llmc.compiler.attention import paged_attention_op
from llmc.compiler.packed_model import PackedCausalLM
from llmc.engine.graph import LOGITS, STEP_INPUTS, cache_names
from llmc.engine.kv_cache import cache_spec
from llmc.engine.plugin import DOMAIN, PLUGIN_VERSION, SCHEMA_VERSION
from llmc.plugins import schema


def _translation():
    import onnxscript

    llmc_opset = onnxscript.values.Opset(DOMAIN, SCHEMA_VERSION)

    def paged_attention(
        q,
        k,
        v,
        key_cache,
        value_cache,
        seq_lens,
        query_start_loc,
        block_tables,
        slot_mapping,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int,
        logit_softcap: float,
        block_size: int,
        layer_idx: int,
    ):
        return llmc_opset.PagedAttention(
            q,
            k,
            v,
            key_cache,
            value_cache,
            seq_lens,
            query_start_loc,
            block_tables,
            slot_mapping,
            plugin_namespace="llmc",
            plugin_version=PLUGIN_VERSION,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
            block_size=block_size,
            layer_idx=layer_idx,
        )

    return paged_attention


def export_onnx(model: torch.nn.Module, block_size: int) -> onnx.ModelProto:
    """Export ``model`` (attention already routed to llmc) to an ONNX ``ModelProto``.

    Inputs: ``STEP_INPUTS`` then ``cache_names(num_layers)``; output ``logits`` [S, vocab] float32.
    Raises whatever ``torch.onnx.export`` raises when the model cannot be traced.
    """

    schema.register_schema()
    spec = cache_spec(model)
    packed = PackedCausalLM(model).eval()
    num_tokens, num_seqs, max_blocks, num_blocks = 5, 2, 3, 8
    example = (
        torch.zeros(num_tokens, dtype=torch.int64),
        torch.arange(num_tokens, dtype=torch.int64),
        torch.tensor([2, 4], dtype=torch.int64),
        torch.tensor([3, 2], dtype=torch.int32),
        torch.tensor([0, 3, 5], dtype=torch.int32),
        torch.zeros(num_seqs, max_blocks, dtype=torch.int32),
        torch.arange(num_tokens, dtype=torch.int64),
    )
    cache_shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    caches = tuple(torch.zeros(cache_shape, dtype=spec.dtype) for _ in range(2 * spec.num_layers))
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
        # *kv_caches is one varargs entry in torch.export's input structure.
        tuple({0: n} for _ in caches),
    )
    with torch.no_grad(), warnings.catch_warnings():
        # Each dynamic dim is named once per input it appears in; the exporter warns for every
        # repeat ("The axis name: num_tokens will not be used ..."): noise, not a problem.
        warnings.filterwarnings("ignore", message=".*axis name.*will not be used")
        program = torch.onnx.export(
            packed,
            example + caches,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=[*STEP_INPUTS, *cache_names(spec.num_layers)],
            output_names=[LOGITS],
            custom_translation_table={paged_attention_op._opoverload: _translation()},
            opset_version=23,
            optimize=False,
            verbose=False,
        )
    return program.model_proto
