"""``BuildConfig``: every option of ``llmc build``, in one group per concern
(``llmc.compiler.config``).

The CLI's flags, help and argument groups come from the groups' fields. ``--config build.yaml``
may set any option by its flat name (``block_size: 8``) or inside its group
(``export: {block_size: 8}``); the command line wins (as ``vllm serve --config`` does).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.config.destination import DestinationOptions
from llmc.compiler.config.export import LORA_OPTIONS, ExportOptions
from llmc.compiler.config.option import flag
from llmc.compiler.config.quantization import QUANTS, QuantOptions
from llmc.compiler.config.source import CPU_DTYPES, DTYPES, SourceOptions
from llmc.compiler.config.target import CPU_TARGET, GPU_TARGETS, TARGETS, TargetOptions
from llmc.compiler.frontend.model_dims import ModelDims
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.front import default_recipe
from llmc.config_file import read_config_file
from llmc.engine import targets as tg
from llmc.errors import BuildConfigError
from llmc.quant.protocol import QuantSpec

__all__ = [
    "CPU_TARGET",
    "DTYPES",
    "FP8_TARGETS",
    "GPU_TARGETS",
    "GROUPS",
    "QUANTS",
    "TARGETS",
    "BuildConfig",
    "flatten_options",
]

#: The option groups by their key in ``to_dict`` and in a grouped YAML file, in help order.
GROUPS: dict[str, type] = {
    "source": SourceOptions,
    "export": ExportOptions,
    "quantization": QuantOptions,
    "calibration": CalibrationOptions,
    "target": TargetOptions,
    "destination": DestinationOptions,
}
_GROUP_OF = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}
# The KV cache in FP8 needs what the fp8 format needs; the CPU runs FP8 as emulation.
FP8_TARGETS = tuple(t for t in TARGETS if FORMATS["fp8"].runs_on(t))
# Options that leave the engine's bytes alone: the provider is recorded beside the hash
# (manifest, registry index), not in the graph; TensorRT's options do not touch cpu engines.
_UNHASHED_TARGET = {"timing_cache", "execution_provider", "max_build_memory"}
_TENSORRT_ONLY = {"builder_opt_level", "hardware_compat"}
# An override that only lets a build through: the engine it allows is the same bytes.
_UNHASHED_EXPORT = {"allow_long_max_seq_len"}


@dataclass(frozen=True)
class BuildConfig:
    """Options of one engine build, by concern (see each group and each option's help).

    An unset ``source.dtype`` becomes the target's default: float32 on cpu, bfloat16 on GPUs;
    an unset ``--recipe`` of a quantizing ``--quant`` the one the recorded front names for the
    target (``llmc.compiler.quantize.front``).
    """

    source: SourceOptions = field(default_factory=SourceOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    quantization: QuantOptions = field(default_factory=QuantOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    target: TargetOptions = field(default_factory=TargetOptions)
    destination: DestinationOptions = field(default_factory=DestinationOptions)

    def __post_init__(self) -> None:
        if self.source.dtype is None:
            known = tg.TARGETS.get(self.target.arch)  # an unknown arch: validate() names it
            dtype = known.default_dtype if known is not None else None
            object.__setattr__(self, "source", replace(self.source, dtype=dtype))
        q = self.quantization
        if q.recipe is None and q.quant in QUANTS and FORMATS[q.quant].quantizes:
            if self.target.arch in tg.TARGETS:  # an unknown arch: validate() names it
                recipe = default_recipe(FORMATS[q.quant], self.target.arch)
                object.__setattr__(self, "quantization", replace(q, recipe=recipe))

    @classmethod
    def of(cls, **options: Any) -> BuildConfig:
        """The config with ``options`` set by their flat names (``of(quant="int8",
        block_size=4)``), the rest at their defaults; not validated. Raises BuildConfigError
        naming unknown options."""
        unknown = sorted(set(options) - set(_GROUP_OF))
        if unknown:
            raise _unknown(unknown)
        groups = {
            group: kind(**{k: v for k, v in options.items() if _GROUP_OF[k] == group})
            for group, kind in GROUPS.items()
        }
        return cls(**groups)

    @classmethod
    def from_sources(cls, yaml_path: str | None, cli: dict[str, Any]) -> BuildConfig:
        """Merge: defaults < YAML file (flat or grouped, ``flatten_options``) < command line
        (``cli``: flat names). Returns the validated config. Raises BuildConfigError on unknown
        keys, a bad value or an unreadable file."""
        values: dict[str, Any] = {}
        if yaml_path:
            loaded = read_config_file(yaml_path, "build config", BuildConfigError)
            values = flatten_options(loaded, yaml_path)
        values.update(cli)
        config = cls.of(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Validate every group, then the rules across groups (a format or KV-cache dtype the
        target cannot run, a dtype the cpu target or the provider lacks). Raises
        BuildConfigError naming the bad option and what to use instead."""
        for group in GROUPS:
            getattr(self, group).validate()
        arch, dtype, quant = self.target.arch, self.source.dtype, self.quantization.quant
        error = FORMATS[quant].target_error(arch, self.quant_spec())
        if error:
            raise BuildConfigError(error)
        if self.kv_cache_dtype == "fp8" and arch not in FP8_TARGETS:
            raise BuildConfigError(
                "--kv-cache-dtype fp8 needs FP8 tensor cores "
                f"(sm{FORMATS['fp8'].min_sm} or newer); {arch} has none: use int8 or int4, "
                "or a newer --arch"
            )
        if self.target.is_cpu and dtype not in CPU_DTYPES:
            raise BuildConfigError(
                f"--dtype {dtype} needs a GPU target (--arch sm80 ...); cpu engines are "
                f"{' or '.join(CPU_DTYPES)}"
            )
        if self.target.execution_provider == "cpu" and dtype == "bfloat16":
            raise BuildConfigError(
                "--execution-provider cpu cannot run --dtype bfloat16: ONNX Runtime's CPU EP has "
                "no bf16 GEMM; use --execution-provider auto or openvino, or --dtype float32"
            )
        if self.target.execution_provider == "openvino-runtime" and dtype != "bfloat16":
            raise BuildConfigError(
                "--execution-provider openvino-runtime computes in bf16: use it with --dtype "
                "bfloat16; float32 and quantized engines run on --execution-provider cpu or "
                "openvino"
            )
        if self.target.execution_provider == "cpu+openvino-runtime" and dtype != "float32":
            raise BuildConfigError(
                "--execution-provider cpu+openvino-runtime runs the CPU EP's float32 engine: use "
                "it with --dtype float32; bfloat16 engines run on openvino or openvino-runtime"
            )
        lora_provider = self.target.execution_provider in ("auto", "cpu") and dtype == "float32"
        if self.export.enable_lora and self.target.is_cpu and not lora_provider:
            raise BuildConfigError(
                "--enable-lora cpu engines run on ONNX Runtime's CPU EP in float32, the runner "
                "that feeds their adapter slots: use --dtype float32 and --execution-provider "
                "auto or cpu"
            )
        if self.target.is_cpu and self.quantization.quantizes and dtype != "float32":
            raise BuildConfigError(
                f"--quant {quant} builds run their unquantized parts in float32 on cpu; "
                "use --dtype float32"
            )

    def for_model(self, dims: ModelDims | None) -> BuildConfig:
        """This config fitted to the model whose dimensions are ``dims`` (None: unknown):
        ``--max-seq-len`` resolved and bounded by its ``max_position_embeddings``
        (``ExportOptions.for_model``). Raises BuildConfigError for one past it without
        ``--allow-long-max-seq-len``."""
        positions = dims.max_position_embeddings if dims is not None else None
        source = dims.source if dims is not None else self.source.model
        return replace(self, export=self.export.for_model(positions, source))

    @property
    def calib_method(self) -> str:
        """The activation range observer: ``--calib-method``, or the default of ``--quant``."""
        return self.calibration.method_for(self.quantization.defaults)

    @property
    def kv_cache_dtype(self) -> str:
        """``--kv-cache-dtype``, its ``auto`` resolved to the default of ``--quant`` (fp8 for
        nvfp4 and mxfp8; "auto", the compute dtype, for the others)."""
        kv = self.quantization.kv_cache_dtype
        return self.quantization.defaults.kv_cache_dtype if kv == "auto" else kv

    @property
    def kv_cache_storage(self) -> str:
        """The KV cache's dtype as the engine stores it: ``kv_cache_dtype``, or for ``auto``
        float32 on cpu (whatever the compute dtype) and the compute dtype on GPUs."""
        kv = self.kv_cache_dtype
        if kv != "auto":
            return kv
        return "float32" if self.target.is_cpu else str(self.source.dtype)

    def quant_spec(self, bound_pairs: bool = False) -> QuantSpec:
        """The quantization options (defaults of ``--quant`` resolved) as a ``QuantSpec``;
        ``bound_pairs``: int8 weight pairs within 128 (CPU hosts without VNNI)."""
        q = self.quantization
        return QuantSpec(
            quant=q.quant,
            recipe=q.recipe or "",
            calib_method=self.calib_method,
            smoothquant_alpha=q.smoothquant_alpha,
            smoothquant_alphas=q.smoothquant_alphas,
            int4_block_size=q.int4_block_size,
            int4_method=q.int4_method,
            weight_rounding=q.weight_rounding,
            weight_only8=q.weight_only8_patterns,
            weight_only8_block_size=q.weight_only8_blocks,
            exclude=q.exclude_patterns,
            kv_cache_dtype=self.kv_cache_dtype,
            bound_pairs=bound_pairs,
            cpu_weights=self.target.is_cpu,
        )

    def output_dir(self, model_id: str) -> Path:
        """The engine directory this build writes: ``--output``, else
        ``engines/<model_id>-<arch>-<dtype>-<quant>``."""
        if self.destination.output:
            return Path(self.destination.output)
        name = f"{model_id}-{self.target.arch}-{self.source.dtype}-{self.quantization.quant}"
        return Path("engines") / name

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The options by group (``{"export": {"block_size": 16, ...}, ...}``), as recorded in
        the manifest and printed by ``--print-config``; ``flatten_options`` reads it back."""
        return {group: asdict(getattr(self, group)) for group in GROUPS}

    def hash(self) -> str:
        """sha256 (hex) of the options that change the engine's bytes (not where it is written,
        the timing cache, the execution provider, TensorRT's options on cpu, nor
        ``--allow-long-max-seq-len``)."""
        d = self.to_dict()
        del d["destination"]
        skip = _UNHASHED_TARGET | (_TENSORRT_ONLY if self.target.is_cpu else set())
        d["target"] = {k: v for k, v in d["target"].items() if k not in skip}
        unhashed = _UNHASHED_EXPORT | (set() if self.export.enable_lora else set(LORA_OPTIONS))
        d["export"] = {k: v for k, v in d["export"].items() if k not in unhashed}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def flatten_options(
    values: Mapping[str, Any], where: str = "build config", ignore_unknown: bool = False
) -> dict[str, Any]:
    """Options by flat name from a mapping that gives them flat (``block-size: 8``), by group
    (``export: {block_size: 8}``) or both; ``-`` in names reads as ``_``. Raises
    BuildConfigError for a group that is not a mapping, an option set twice, or (unless
    ``ignore_unknown``) unknown names; ``where`` names the source in the message."""
    flat: dict[str, Any] = {}
    unknown: list[str] = []

    def put(name: str, value: Any, path: str, group: str | None) -> None:
        if name not in _GROUP_OF:
            unknown.append(path)
        elif group is not None and _GROUP_OF[name] != group:
            unknown.append(f"{path} (a {_GROUP_OF[name]} option)")
        elif name in flat:
            raise BuildConfigError(f"{where} sets {flag(name)} twice")
        else:
            flat[name] = value

    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in GROUPS:
            put(key, value, key, None)
            continue
        if not isinstance(value, Mapping):
            raise BuildConfigError(f"{where}: {key} must be a mapping of option: value")
        for name, option_value in value.items():
            name = name.replace("-", "_")
            put(name, option_value, f"{key}.{name}", key)
    if unknown and not ignore_unknown:
        raise _unknown(unknown)
    return flat


def _unknown(names: list[str]) -> BuildConfigError:
    return BuildConfigError(
        f"unknown build option(s) {', '.join(names)}; known: {', '.join(sorted(_GROUP_OF))} "
        f"(flat, or under their group: {', '.join(GROUPS)})"
    )
