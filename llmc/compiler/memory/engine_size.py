"""What a build will hold, from the checkpoint's headers alone: the engine's weight bytes under a
quantization spec, and the working set of one decoder layer (``memory.plan``).

Per checkpoint tensor (safetensors names, or GGUF names): a 2-D weight of a decoder layer or the
vocabulary projection is stored in the format its module gets (``--exclude``: float32;
``--weight-only8``: 8-bit weight-only; else ``--quant``'s; ``QuantFormat.weight_bytes``), other
tensors in float32. The input embedding stays a float32 table unless it is tied to a quantized
projection (the lookup then reads the projection's quantized table, ``quantized_embedding``).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from llmc.compiler.frontend.gguf_file import check_gguf
from llmc.compiler.frontend.model_source import ModelSource
from llmc.compiler.quantize.formats import FORMATS, WEIGHT_ONLY8
from llmc.compiler.weights.checkpoint_weights import index_safetensors
from llmc.quant.protocol import QuantFormat, QuantSpec

_EMBEDDINGS = ("model.embed_tokens.weight", "token_embd.weight")
_PROJECTIONS = ("lm_head.weight", "output.weight")
_LAYER = re.compile(r"(?:layers|blk)\.(\d+)\.")
# Projections that read one input (Hugging Face and GGUF names).
_SHARED_INPUT = re.compile(
    r"(?P<qkv>[qkv]_proj|attn_[qkv])\.|(?P<gate_up>(?:gate|up)_proj|ffn_(?:gate|up))\."
)


@dataclass(frozen=True)
class CheckpointShapes:
    """The checkpoint's tensors as (name, shape), and how to read them.

    Attributes:
        tensors: (name, shape) of every tensor, shapes as stored (safetensors [out, in];
            GGUF [in, out], ggml's order).
        gguf: the names and shapes are GGUF's.
    """

    tensors: tuple[tuple[str, tuple[int, ...]], ...]
    gguf: bool

    @classmethod
    def of(cls, src: ModelSource) -> CheckpointShapes:
        """Read ``src``'s headers (no weights). Raises ModelSourceError for a bad file."""
        if src.gguf_file is not None:
            tensors = [
                (t.name, tuple(t.dims)) for f in src.weight_files for t in check_gguf(f).tensors
            ]
            return cls(tuple(tensors), True)
        index = index_safetensors(src.weight_files)
        return cls(tuple((n, tuple(loc.shape)) for n, loc in index.items()), False)

    def float32_bytes(self) -> tuple[int, int]:
        """(total, largest) float32 bytes of the tensors."""
        sizes = [4 * math.prod(s) for _, s in self.tensors]
        return sum(sizes), max(sizes, default=0)

    def in_features(self, shape: tuple[int, ...]) -> int:
        """K of a 2-D weight (the MatMul's reduction dimension)."""
        return shape[0] if self.gguf else shape[1]

    def hidden_size(self) -> int:
        """The embedding's width (0 if the checkpoint has none)."""
        for name, shape in self.tensors:
            if name in _EMBEDDINGS and len(shape) == 2:
                return min(shape)
        return 0

    def layer_bytes(self) -> int:
        """float32 bytes of the largest decoder layer."""
        layers: dict[int, int] = {}
        for name, shape in self.tensors:
            m = _LAYER.search(name)
            if m:
                layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + 4 * math.prod(shape)
        return max(layers.values(), default=0)

    def largest_in_features(self) -> int:
        """The largest K of a decoder layer's 2-D weight (0 if none)."""
        return max(
            (self.in_features(s) for n, s in self.tensors if _LAYER.search(n) and len(s) == 2),
            default=0,
        )

    def largest_gram_bytes(self) -> int:
        """Bytes of the Gram matrices one layer's GPTQ keeps: float64 K x K per input, the
        projections that read one input (q, k and v; gate and up) fused into one MatMul by the
        graph passes and sharing one."""
        grams: dict[tuple[int, str], int] = {}
        for name, shape in self.tensors:
            m = _LAYER.search(name)
            if m and len(shape) == 2:
                k = self.in_features(shape)
                shared = _SHARED_INPUT.search(name)
                grams[int(m.group(1)), shared.lastgroup if shared else name] = 8 * k * k
        layers: dict[int, int] = {}
        for (layer, _), n in grams.items():
            layers[layer] = layers.get(layer, 0) + n
        return max(layers.values(), default=0)


def _module(name: str) -> str:
    return name.removesuffix(".weight")


def _weight_bytes(module: str, spec: QuantSpec) -> float:
    if any(fnmatch.fnmatchcase(module, p) for p in spec.exclude):
        return 4.0
    if any(fnmatch.fnmatchcase(module, p) for p in spec.weight_only8):
        return FORMATS[WEIGHT_ONLY8].weight_bytes
    fmt = FORMATS[spec.quant]
    if spec.cpu_weights and type(fmt).cpu_weight is not QuantFormat.cpu_weight:
        return 4.0  # emulated on the CPU: the float32 weight its dequantization gives
    return fmt.weight_bytes


def engine_weight_bytes(shapes: CheckpointShapes, spec: QuantSpec | None) -> int:
    """Estimated weight bytes of the engine built with ``spec`` (None: unquantized)."""
    names = {n for n, _ in shapes.tensors}
    tied = not names & set(_PROJECTIONS)
    total = 0.0
    for name, shape in shapes.tensors:
        n = math.prod(shape)
        if spec is None or len(shape) != 2:
            total += 4 * n
        elif name in _EMBEDDINGS:
            # Tied: the quantized projection's table, also read by the lookup; else float32.
            total += n * _weight_bytes("lm_head", spec) if tied else 4 * n
        else:
            module = "lm_head" if name in _PROJECTIONS else _module(name)
            total += n * _weight_bytes(module, spec)
    return int(total)
