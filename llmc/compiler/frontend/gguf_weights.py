"""A GGUF file's tensors under their Hugging Face names, each dequantized when it is read.

transformers loads a GGUF file whole (``from_pretrained(..., gguf_file=...)``; for Llama, Gemma
and the other architectures of ``modeling_gguf_pytorch_utils.TENSOR_PROCESSORS`` its loader is
``load_gguf_checkpoint``): every tensor is dequantized to float32 (``gguf.dequantize``), passed
through the architecture's ``TensorProcessor`` (Llama: llama.cpp's Q/K row permutation undone;
Gemma 2/3: norms stored as ``w + 1`` get ``- 1``), named by ``get_gguf_hf_weights_map`` and cast
to the model's dtype. Here the same functions run on one tensor when ``onnx_ir`` writes it, so
a build holds one dequantized tensor at a time instead of the model, with transformers' float32
weights bit for bit (``tests/compiler/test_gguf_streaming.py``).

Streamed: architectures whose processor turns one stored tensor into one weight of its shape
(``_ONE_TO_ONE``). Not streamed (loaded whole, as before): processors that split or merge
tensors (MoE experts, GPT-2's output), architectures transformers loads through its newer
conversion path (``transformers.integrations.gguf.is_gguf_arch_supported``: Qwen 3.5, LFM2),
and files written big-endian.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from llmc.compiler.frontend.gguf_file import GgufSummary, check_gguf
from llmc.errors import ModelSourceError

# TensorProcessor classes (by name) whose ``process`` maps one tensor to one of the same shape,
# and whether it reads the config parsed from the file (parsing it again costs 13 s for Gemma 3's
# 262k-token vocabulary, so it is done only for a processor that reads it).
_ONE_TO_ONE = {
    "TensorProcessor": False,
    "LlamaTensorProcessor": True,  # num_attention_heads, num_key_value_heads
    "Gemma2TensorProcessor": False,
    "NemotronTensorProcessor": False,
}


@dataclass(frozen=True)
class GgufTensor:
    """One GGUF tensor as its Hugging Face weight: ``length`` bytes at ``offset`` of ``file``
    in ggml type ``ggml_type``, read as float32 of ``shape`` (numpy order)."""

    file: Path
    offset: int
    length: int
    ggml_type: int
    gguf_name: str  # the processor picks its conversion by this name
    shape: tuple[int, ...]
    processor: Any = field(compare=False)  # transformers TensorProcessor of the architecture
    dtype: ir.DataType = ir.DataType.FLOAT

    def read(self) -> np.ndarray:
        """Dequantize and convert the tensor as ``load_gguf_checkpoint`` does: float32, shape
        ``self.shape``, C-contiguous. Raises NotImplementedError for a ggml type ``gguf``
        cannot dequantize (transformers cannot load it either)."""
        from gguf import GGMLQuantizationType, dequantize
        from gguf.quants import quant_shape_to_byte_shape

        qtype = GGMLQuantizationType(self.ggml_type)
        stored = np.memmap(
            self.file, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.length,)
        )
        # As gguf's reader presents a tensor to dequantize: its bytes, one row per last axis.
        blocks = stored.reshape(quant_shape_to_byte_shape(self.shape, qtype))
        weights = self.processor.process(weights=dequantize(blocks, qtype), name=self.gguf_name)
        return np.ascontiguousarray(weights.weights, dtype=np.float32)


def _processor_class(summary: GgufSummary) -> type | None:
    """The transformers TensorProcessor class that loads ``summary``'s file, or None when that
    file does not stream (see the module docstring)."""
    from transformers.integrations.gguf import is_gguf_arch_supported
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = summary.architecture
    if arch is None or not summary.little_endian or is_gguf_arch_supported(arch):
        return None
    cls = TENSOR_PROCESSORS.get(arch, TensorProcessor)
    return cls if cls.__name__ in _ONE_TO_ONE else None


def can_stream_gguf(path: Path) -> bool:
    """Whether the GGUF file at ``path`` can be read one tensor at a time by ``index_gguf``.
    Reads the header only. Raises ModelSourceError for a malformed file (``check_gguf``)."""
    return _processor_class(check_gguf(path)) is not None


def index_gguf(path: Path, model: Any) -> dict[str, GgufTensor]:
    """State-dict name -> ``GgufTensor`` of every tensor of the GGUF file at ``path`` that
    ``model`` (the transformers model it is loaded into, on the meta device) has a place for;
    a tensor it has none for (``rope_freqs``) is skipped, as transformers skips it.

    Reads the header only. Raises ModelSourceError for a file that does not stream
    (``can_stream_gguf``) or a tensor whose shape is not its weight's.
    """
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    summary = check_gguf(path)
    cls = _processor_class(summary)
    if cls is None:
        raise ModelSourceError(
            f"{path} (architecture {summary.architecture!r}) cannot be read one tensor at a "
            "time; it is loaded whole"
        )
    config = None
    if _ONE_TO_ONE[cls.__name__]:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    processor = cls(config=config)
    names = get_gguf_hf_weights_map(model, processor)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    index = {}
    for info in summary.tensors:
        name = names.get(info.name)
        if name is None:
            continue
        shape = tuple(reversed(info.dims))
        if shapes.get(name) != shape:
            raise ModelSourceError(
                f"{path}: tensor {info.name} has shape {list(shape)}, but the model's {name} "
                f"is {list(shapes.get(name, ()))}; the file does not match its own config"
            )
        index[name] = GgufTensor(
            path, info.offset, info.num_bytes, info.ggml_type, info.name, shape, processor
        )
    return index
