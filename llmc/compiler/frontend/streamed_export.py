"""The float engine graph of a checkpoint, written without loading the checkpoint.

Method: the model is built on the meta device (shapes, no values), exported with plugin nodes as
usual (``export.export_ir``; read from ``export_cache`` when this code exported this config
before), and each graph initializer is then bound to its tensor in the checkpoint
(``checkpoint_weights``: a safetensors file's bytes; ``gguf_weights``: a GGUF tensor
dequantized when read, as transformers converts it); the graph passes rewrite structure and leave
weights unread (``passes/weight_transpose.py``, the lazy concatenation of ``parallel_matmul``), and
``onnx_ir.save`` writes the graph with its weights as external data, a bounded number of tensors in
flight. Peak memory is the largest tensors in flight plus the graph, not the model (measured on a
Qwen2.5-0.5B-shaped checkpoint in ``benchmarks/RESULTS.md``). Buffers a model computes at
construction (rotary ``inv_freq``, embedding scales) come from a CPU instance whose parameters stay
on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from llmc.compiler.frontend.export_cache import cached_export
from llmc.compiler.frontend.gguf_conversion import gguf_config
from llmc.compiler.frontend.gguf_weights import can_stream_gguf, index_gguf
from llmc.compiler.frontend.model_source import ModelSource
from llmc.compiler.weights.checkpoint_weights import bind_initializers, index_safetensors
from llmc.compiler.weights.stored_weights import (
    checkpoint_float_dtype,
    fold_stored_weights,
    store_weights,
)

FLOAT_GRAPH = "float.onnx"


@dataclass(frozen=True)
class MetaModel:
    """A transformers causal LM on the meta device and what binding its weights needs."""

    model: Any  # transformers PreTrainedModel, parameters and buffers on "meta"
    buffers: dict[str, np.ndarray]  # state-dict name -> each buffer's values, computed on CPU
    aliases: dict[str, str]  # tied weight -> the checkpoint tensor it shares


def can_stream(src: ModelSource) -> bool:
    """Whether ``src``'s weights can be read one tensor at a time: a safetensors checkpoint,
    or a GGUF file of an architecture ``gguf_weights`` converts tensor by tensor (others are
    dequantized by transformers as a whole and take the in-memory path). Reads headers only."""
    if src.gguf_file is not None:
        return can_stream_gguf(src.directory / src.gguf_file)
    return bool(src.weight_files)


def meta_model(src: ModelSource, digest: str | None = None) -> MetaModel:
    """Build ``src``'s model with parameters on the meta device and llmc's attention routing;
    buffers are computed on CPU first and returned beside it. The config is the one
    ``from_pretrained`` reads (a GGUF file's metadata for a GGUF file: through the conversion
    cache, ``gguf_conversion``, when the file's sha256 ``digest`` is given)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from llmc.compiler.frontend.attention import register_attention

    gguf = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    if gguf and digest is not None:
        config = gguf_config(src.directory, src.gguf_file, digest)
    else:
        config = AutoConfig.from_pretrained(str(src.directory), **gguf)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=register_attention()
        )
    model.eval()
    model.tie_weights()
    # As from_pretrained reads it: never beside a GGUF file, whose directory is not a checkpoint's.
    if not gguf and (src.directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(src.directory))
    buffers = {k: v.float().numpy() for k, v in model.named_buffers()}
    aliases = dict(getattr(model, "all_tied_weights_keys", None) or {})
    model.to("meta")
    return MetaModel(model, buffers, aliases)


def write_float_graph(
    src: ModelSource,
    meta: MetaModel,
    block_size: int,
    work_dir: Path,
    in_flight_bytes: int,
    stage,
    optional_passes: frozenset[str] = frozenset(),
    lora=None,
) -> tuple[Path, dict[str, int]]:
    """Export ``meta``'s model (with the adapter slots ``lora``, an ``onnx_export.LoRASlots``),
    bind its weights to ``src``'s checkpoint as float32, run the graph passes, and write
    ``work_dir / FLOAT_GRAPH`` (+ ``.data``; weights of a bfloat16 or float16 checkpoint stored
    in that type, ``stored_weights``; ``load_float_graph`` reads it back with float32 weights)
    with at most ``in_flight_bytes`` of weights read and not yet written. Returns the path and
    the pass report. ``optional_passes``: as ``passes.run_passes``. Raises ModelSourceError
    when a graph weight is not in the checkpoint (or a GGUF tensor's shape is not its
    weight's)."""
    from llmc.compiler.frontend.onnx_export import export_ir
    from llmc.compiler.passes import run_passes

    with stage("export to ONNX"):
        model = cached_export(
            meta.model, block_size, lora, lambda: export_ir(meta.model, block_size, lora)
        )
        if src.gguf_file is not None:
            index = index_gguf(src.directory / src.gguf_file, meta.model)
        else:
            index = index_safetensors(src.weight_files)
        bind_initializers(model.graph, index, meta.buffers, ir.DataType.FLOAT, meta.aliases)
    with stage("graph passes"):
        pass_report = run_passes(model, optional_passes)
    stored = checkpoint_float_dtype(loc.dtype for loc in index.values())
    if stored is not None:  # written at the checkpoint's width, computed in float32
        store_weights(model, stored)
    with stage("write the float graph"):
        work_dir.mkdir(parents=True, exist_ok=True)
        path = work_dir / FLOAT_GRAPH
        ir.save(
            model,
            path,
            external_data=FLOAT_GRAPH + ".data",
            max_in_flight_bytes=in_flight_bytes,
        )
    return path, pass_report


def load_float_graph(work_dir: Path) -> ir.Model:
    """The float graph ``write_float_graph`` wrote into ``work_dir``, with float32 weights
    (stored ones widened when read: ``stored_weights.fold_stored_weights``); nothing is read."""
    model = ir.load(work_dir / FLOAT_GRAPH)
    fold_stored_weights(model)
    return model
