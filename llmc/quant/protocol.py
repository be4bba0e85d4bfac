"""The quantization format protocol: what every ``--quant`` format says about itself.

A format is one module (``llmc.compiler.quantize.formats.<name>``) holding one object with the
members of ``QuantFormat``, listed in the registry ``llmc.compiler.quantize.formats.FORMATS``.
As gpt-fast's quantization handlers, it has two halves:

- compute the quantized weights: ``quantize`` turns one MatMul's float weight and calibration
  statistics into a ``QuantizedLinear`` (the weight on its grid, the smoothing factors, the
  activation grid and clip value); the compiler writes that into the graph as Q/DQ nodes;
- rewrite for the runtime: ``rewrite_for_cpu`` / ``rewrite_for_tensorrt`` adapt the Q/DQ graph
  to what ONNX Runtime's CPU EP or TensorRT runs, ``cpu_kernel`` names the fused ONNX Runtime
  kernel each quantized MatMul must become, ``min_sm`` and ``target_error`` the TensorRT rules.

Recipes (observer, modules kept float, modules given 8-bit weight-only weights, by name) come
with the format. This module and ``grids`` import numpy and ml_dtypes only (torch where a torch
twin is called), so calibration algorithms can depend on them without depending on the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from llmc.engine import targets
from llmc.quant.grids import Grid, QuantizedWeight

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize (the quantization options of ``BuildConfig``)."""

    quant: str  # a key of the format registry
    recipe: str = ""  # the recipe's name (``--recipe``), recorded with the quantization
    calib_method: str = "max"
    smoothquant_alpha: float = 0.5
    smoothquant_alphas: tuple[float, ...] = ()  # per-layer choice among these (search_alpha)
    int4_block_size: int = 128
    int4_method: str = "awq"  # "awq" | "rtn"
    weight_only8: tuple[str, ...] = ()
    weight_only8_block_size: int = 32  # input channels per 8-bit weight-only scale
    exclude: tuple[str, ...] = ()
    kv_cache_dtype: str = "auto"
    weight_rounding: str = "nearest"  # "nearest" | "gptq"
    bound_pairs: bool = False  # int8 weight pairs within 128, for GEMMs without VNNI (grids)
    # Write the weights of formats the CPU emulates (``QuantFormat.cpu_weight``) as the float32
    # weights a CPU engine runs, as they are made (cpu targets: the build then streams).
    cpu_weights: bool = False
    # Per-module formats chosen by ``--accuracy-target`` ((module, format name) pairs; "none"
    # keeps the module float); they override ``quant`` and ``weight_only8`` for those modules.
    assignment: tuple[tuple[str, str], ...] = ()


class ActivationStats(Protocol):
    """What a format reads of one MatMul input's calibration statistics
    (``llmc.calibration.observers.TensorStats``): rows [*, C] seen as C channels."""

    channel_absmax: np.ndarray  # [C] max |x|
    sample: np.ndarray  # [R, C] uniform sample of rows
    gram: np.ndarray | None  # [C, C] X^T X, when collected

    @property
    def absmax(self) -> float: ...
    @property
    def channel_meanabs(self) -> np.ndarray: ...


@dataclass(frozen=True)
class ActivationQuant:
    """A per-tensor QuantizeLinear + DequantizeLinear of the MatMul's input: ``grid`` and clip
    value ``amax`` (scale ``grid.scale(amax)``, zero point 0)."""

    grid: Grid
    amax: float


@dataclass(frozen=True)
class QuantizedLinear:
    """What a format decided for one MatMul ``Y = X W``, written as Q/DQ nodes by the compiler:
    ``X / smoothing`` (when given) -> ``activation`` Q/DQ (when given) -> MatMul with B =
    DequantizeLinear(``weight``); ``record`` is the module's entry in the quantization report
    (its numbers; ``format`` defaults to the format's label)."""

    weight: QuantizedWeight
    smoothing: np.ndarray | None = None  # [K]: X divided by it, W's rows multiplied by it
    activation: ActivationQuant | None = None
    record: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FormatDefaults:
    """What a recipe sets of a format's options: the activation observer (``--calib-method``),
    the module patterns given 8-bit weight-only weights (``--weight-only8``) or kept float
    (``--exclude``), comma-separated as on the command line, what ``--kv-cache-dtype auto``
    stores ("auto": the compute dtype; or "fp8", "int8"), and the input channels per 8-bit
    weight-only scale (``--weight-only8-block-size``; 32, llama.cpp's Q8_0 block)."""

    calib_method: str = "max"
    weight_only8: str = ""
    exclude: str = ""
    kv_cache_dtype: str = "auto"
    weight_only8_block_size: int = 32


#: The name of the one recipe of a format that names none.
DEFAULT_RECIPE = "default"


@dataclass(frozen=True)
class Recipe:
    """One named way to build a format (``--recipe``), as ModelOpt's quantization configs and
    llama.cpp's named types are: ``defaults`` are the options it sets, ``summary`` the phrase of
    ``--recipe``'s help. Which recipe a build gets by default is measured, not declared
    (``llmc.compiler.quantize.front``)."""

    name: str
    summary: str
    defaults: FormatDefaults = FormatDefaults()


def sm_of(name: str) -> int | None:
    """The compute capability x 10 of target ``name`` (``sm89`` -> 89; ``sm120`` -> 120), None
    for a target that runs on no GPU (``cpu``). Raises UnknownTargetError (a ValueError) for a
    name the target registry (``llmc.engine.targets``) does not know."""
    capability = targets.target(name).capability
    return None if capability is None else capability[0] * 10 + capability[1]


@runtime_checkable
class QuantFormat(Protocol):
    """One quantization format. Subclass it to inherit the defaults of the optional members."""

    name: str  # registry key and --quant value
    label: str  # what a module quantized this way is counted as in the report ("int8_w8a8")
    summary: str = ""  # the phrase of --quant's help ("W8A8, SmoothQuant")
    offered: bool = True  # a --quant choice (else chosen per module, as --weight-only8's)
    quantizes: bool = True  # False for "none": no calibration, no Q/DQ
    needs_stats: bool = True  # activation statistics of every module it quantizes
    # The named recipes; a format that names none has one, ``DEFAULT_RECIPE``, of ``defaults``.
    recipes: tuple[Recipe, ...] = ()
    defaults: FormatDefaults = FormatDefaults()
    cpu_kernel: str | None = None  # ONNX Runtime op each quantized MatMul fuses into (CPU)
    weight_bytes: float = 4.0  # engine bytes per weight of a module in this format, scales in
    ort_session_config: Mapping[str, str] = {}  # session entries its CPU engines need
    min_sm: int = 80  # oldest GPU arch (compute capability x 10) TensorRT runs it on
    # The formats ``--accuracy-target`` may give a module instead, cheapest first (float, the
    # last resort, is implied).
    fallbacks: tuple[str, ...] = ("int8_weight_only",)
    # ``quantize`` reads its weight a slice of output channels at a time (``weight[:, a:b]``),
    # so it may be given an array-like that widens each slice when read (``WeightColumns``)
    reads_column_slices: bool = False

    def recipe_list(self) -> tuple[Recipe, ...]:
        """The format's recipes: ``recipes``, or the one recipe ``DEFAULT_RECIPE`` of
        ``defaults`` for a format that names none."""
        return self.recipes or (Recipe(DEFAULT_RECIPE, self.summary, self.defaults),)

    def recipe(self, name: str | None) -> Recipe:
        """Recipe ``name`` (None: the first). Raises KeyError for a name the format lacks."""
        listed = self.recipe_list()
        if name is None:
            return listed[0]
        for recipe in listed:
            if recipe.name == name:
                return recipe
        raise KeyError(name)

    def quantize(
        self, weight: np.ndarray, stats: ActivationStats | None, spec: QuantSpec
    ) -> QuantizedLinear:
        """Quantize ``weight`` [K, N] float32 (MatMul's B) given its input's ``stats`` (None
        when ``needs_stats`` is False and GPTQ is off)."""
        ...

    def runs_on(self, target: str) -> bool:
        """Whether engines of this format run on ``target`` (a name of the target registry):
        everywhere on a target without a GPU (the CPU runs every format, FP8 as emulation), on
        GPUs of ``min_sm`` or newer. Raises UnknownTargetError for an unknown name."""
        sm = sm_of(target)
        return sm is None or sm >= self.min_sm

    def target_error(self, target: str, spec: QuantSpec) -> str | None:
        """Why ``spec`` cannot be built for ``target``, or None."""
        if self.runs_on(target):
            return None
        return (
            f"--quant {self.name} needs sm{self.min_sm} or newer; {target} is older: use "
            "another --quant or a newer --arch"
        )

    def cpu_isa(self, host_features: tuple[str, ...]) -> tuple[str, ...]:
        """ISA features a CPU engine of this format built on a host with ``host_features``
        depends on, beyond the SIMD width."""
        return ()

    def cpu_weight(self, weight: QuantizedWeight) -> np.ndarray | None:
        """The float32 [K, N] weight a CPU engine runs in place of ``weight``'s dequantization,
        for a format ONNX Runtime's CPU EP cannot run and emulates (FP8, NVFP4, MXFP8): the
        numbers ``rewrite_for_cpu`` computes, made when the weight is quantized so that a
        streamed build never holds the model. None (the default): the Q/DQ weight stays."""
        return None

    def rewrite_for_cpu(self, model: onnx.ModelProto) -> int:
        """Adapt the Q/DQ graph in place to ONNX Runtime's CPU EP; returns the rewrites."""
        return 0

    def rewrite_for_tensorrt(self, model: onnx.ModelProto) -> int:
        """Adapt the Q/DQ graph in place to TensorRT (before the compute-dtype conversion);
        returns the rewrites. Must leave other formats' Q/DQ nodes alone: every format's rewrite
        runs on every TensorRT graph."""
        return 0
