"""``BuildConfig``: every option of ``llmc build``, one documented field each.

The CLI's flags and help come from these fields; ``--config build.yaml`` may set any field and
the command line wins (as ``vllm serve --config`` does).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from llmc.compiler.quantize.formats import FORMATS, QuantChoices
from llmc.errors import BuildConfigError
from llmc.quant.protocol import FormatDefaults, QuantSpec

CPU_TARGET = "cpu"
GPU_TARGETS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")
TARGETS = (CPU_TARGET, *GPU_TARGETS)
DTYPES = ("float32", "bfloat16", "float16")
CPU_DTYPES = ("float32", "bfloat16")
# TensorRT IBuilderConfig.hardware_compatibility_level and builder_optimization_level values.
HARDWARE_COMPAT = ("none", "ampere+", "same-cc")
BUILDER_OPT_LEVELS = range(0, 6)
QUANTS = QuantChoices()  # the offered formats of the registry, llmc.compiler.quantize.formats
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
INT4_METHODS = ("awq", "rtn")
WEIGHT_ROUNDINGS = ("gptq", "nearest")
INT4_BLOCK_SIZES = (32, 64, 128)
CALIB_METHODS = ("max", "percentile", "mse")
# The KV cache in FP8 needs what the fp8 format needs; the CPU runs FP8 as emulation.
FP8_TARGETS = tuple(t for t in TARGETS if FORMATS["fp8"].runs_on(t))
EXECUTION_PROVIDERS = ("auto", "cpu", "openvino")


def _opt(default, help: str, choices: tuple | None = None):
    return field(default=default, metadata={"help": help, "choices": choices})


def _defaults(quant: str) -> FormatDefaults:
    return FORMATS[quant].defaults if quant in FORMATS else FormatDefaults()


def _per_quant(default: str) -> str:
    """``default``'s value of every quantizing --quant choice, for a field's help."""
    values = [(q, getattr(_defaults(q), default)) for q in QUANTS if FORMATS[q].quantizes]
    return "; ".join(f"{q}: {v or 'none'}" for q, v in values)


@dataclass
class BuildConfig:
    """Options of one engine build (see each field's help)."""

    model: str = _opt("gemma-3-270m", "HF checkpoint dir (safetensors), .gguf file, or alias")
    arch: str = _opt(CPU_TARGET, "target: cpu (this host's ISA) or a GPU arch", TARGETS)
    dtype: str | None = _opt(
        None,
        "compute and weight dtype of the engine; default float32 on cpu, bfloat16 on GPU "
        "targets (float16 is GPU-only)",
        DTYPES,
    )
    quant: str = _opt(
        "none",
        "quantization as Q/DQ nodes: "
        + ", ".join(f"{q} ({FORMATS[q].summary})" for q in QUANTS if FORMATS[q].quantizes),
        QUANTS,
    )
    kv_cache_dtype: str = _opt(
        "auto", "KV cache storage: auto (compute dtype), fp8, int8", KV_CACHE_DTYPES
    )
    int4_block_size: int = _opt(128, "int4: input channels per weight scale", INT4_BLOCK_SIZES)
    int4_method: str = _opt("awq", "int4: AWQ activation-aware scales or plain RTN", INT4_METHODS)
    weight_rounding: str = _opt(
        "gptq",
        "how quantized weights are rounded to their grid: gptq (GPTQ error compensation with "
        "the calibration inputs' Hessian; same scales and Q/DQ nodes) or nearest",
        WEIGHT_ROUNDINGS,
    )
    weight_only8: str | None = _opt(
        None,
        "comma-separated module patterns given 8-bit weight-only (block-wise) weights instead "
        "of --quant's format; default per --quant: "
        + _per_quant("weight_only8")
        + " ('' for none)",
    )
    smoothquant_alpha: float = _opt(0.5, "int8: SmoothQuant migration strength in [0, 1]")
    smoothquant_alpha_grid: str = _opt(
        "",
        "int8: comma-separated alphas in [0, 1] (or 'auto' for 0, 0.1, ..., 1) to choose from per "
        "layer, by the layer's output error on the calibration sample; replaces "
        "--smoothquant-alpha ('' for none)",
    )
    exclude: str | None = _opt(
        None,
        "comma-separated module patterns kept unquantized (fnmatch on checkpoint names, e.g. "
        "'lm_head,*.down_proj'); default per --quant: " + _per_quant("exclude") + " ('' for none)",
    )
    calib_data: str | None = _opt(
        None, ".txt or .jsonl ('text' field); its first 80% calibrates (default: model samples)"
    )
    calib_samples: int = _opt(64, "calibration windows")
    calib_seq_len: int = _opt(256, "tokens per calibration window")
    calib_method: str | None = _opt(
        None,
        "activation range observer: max, percentile (99.99th), mse; default per --quant: "
        + _per_quant("calib_method"),
        CALIB_METHODS,
    )
    eval_data: str | None = _opt(
        None,
        "held-out text for the accuracy report, its last 20% (default: --calib-data's last "
        "20%, else model samples of another seed)",
    )
    eval_samples: int = _opt(16, "accuracy report windows (of --calib-seq-len tokens)")
    cache_dir: str = _opt("~/.cache/llmc", "where calibration statistics are cached")
    max_seq_len: int = _opt(4096, "longest sequence (prompt + output tokens) the engine serves")
    max_num_tokens: int = _opt(2048, "most tokens in one step (the scheduler's token budget)")
    max_batch: int = _opt(16, "most sequences in one step")
    block_size: int = _opt(16, "tokens per KV-cache block")
    threads: int = _opt(2, "CPU threads used to optimize and run the engine")
    output: str | None = _opt(
        None, "engine directory (default: engines/<model>-<arch>-<dtype>-<quant>)"
    )
    timing_cache: str | None = _opt(
        None, "GPU targets: TensorRT timing cache file, read if it exists and written back"
    )
    builder_opt_level: int = _opt(
        3, "GPU targets: TensorRT builder optimization level 0-5 (higher: slower build)"
    )
    hardware_compat: str = _opt(
        "none",
        "GPU targets: TensorRT hardware compatibility: none (the builder's GPU only), ampere+ "
        "(any sm80+ GPU, slower), same-cc (GPUs of the builder's compute capability)",
        HARDWARE_COMPAT,
    )
    execution_provider: str = _opt(
        "auto",
        "cpu engines: ONNX Runtime execution provider; auto measures every provider that runs "
        "here and keeps the fastest whose logits agree with the CPU EP's; cpu or openvino force "
        "one (still checked and timed)",
        EXECUTION_PROVIDERS,
    )
    registry: str | None = _opt(
        None, "after the build, publish the engine into this registry root (e.g. engines)"
    )

    def __post_init__(self) -> None:
        if self.dtype is None:
            self.dtype = "float32" if self.arch == CPU_TARGET else "bfloat16"

    def validate(self) -> None:
        """Raise BuildConfigError naming the bad option and the allowed values."""
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise BuildConfigError(
                    f"--{f.name.replace('_', '-')} {value!r} is not one of {', '.join(choices)}"
                )
        for name in (
            "max_seq_len",
            "max_num_tokens",
            "max_batch",
            "block_size",
            "threads",
            "calib_samples",
            "calib_seq_len",
            "eval_samples",
        ):
            if getattr(self, name) < 1:
                raise BuildConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.calib_seq_len < 2:
            raise BuildConfigError("--calib-seq-len must be >= 2")
        _ = self.smoothquant_alphas  # BuildConfigError if the grid does not parse
        if not 0.0 <= self.smoothquant_alpha <= 1.0:
            raise BuildConfigError(
                f"--smoothquant-alpha must be in [0, 1], got {self.smoothquant_alpha}"
            )
        error = FORMATS[self.quant].target_error(self.arch, self.quant_spec())
        if error:
            raise BuildConfigError(error)
        if self.kv_cache_dtype == "fp8" and self.arch not in FP8_TARGETS:
            raise BuildConfigError(
                "--kv-cache-dtype fp8 needs FP8 tensor cores "
                f"(sm{FORMATS['fp8'].min_sm} or newer); {self.arch} has none: use int8 or int4, "
                "or a newer --arch"
            )
        if self.arch == CPU_TARGET and self.dtype not in CPU_DTYPES:
            raise BuildConfigError(
                f"--dtype {self.dtype} needs a GPU target (--arch sm80 ...); cpu engines are "
                f"{' or '.join(CPU_DTYPES)}"
            )
        if self.builder_opt_level not in BUILDER_OPT_LEVELS:
            raise BuildConfigError(
                f"--builder-opt-level must be 0-5 (TensorRT's range), got {self.builder_opt_level}"
            )
        if self.execution_provider != "auto" and self.arch != CPU_TARGET:
            raise BuildConfigError(
                f"--execution-provider {self.execution_provider} applies to cpu engines; "
                f"{self.arch} engines run on TensorRT"
            )
        if self.execution_provider == "cpu" and self.dtype == "bfloat16":
            raise BuildConfigError(
                "--execution-provider cpu cannot run --dtype bfloat16: ONNX Runtime's CPU EP has "
                "no bf16 GEMM; use --execution-provider auto or openvino, or --dtype float32"
            )
        if self.arch == CPU_TARGET and FORMATS[self.quant].quantizes and self.dtype != "float32":
            raise BuildConfigError(
                f"--quant {self.quant} builds run their unquantized parts in float32 on cpu; "
                "use --dtype float32"
            )

    @property
    def calib_method_for_quant(self) -> str:
        """``--calib-method``, or the default of ``--quant``."""
        return self.calib_method or _defaults(self.quant).calib_method

    @property
    def weight_only8_patterns(self) -> tuple[str, ...]:
        """``--weight-only8`` split into patterns; unset means the default of ``--quant``."""
        value = self.weight_only8
        if value is None:
            value = _defaults(self.quant).weight_only8
        return tuple(p.strip() for p in value.split(",") if p.strip())

    @property
    def smoothquant_alphas(self) -> tuple[float, ...]:
        """``--smoothquant-alpha-grid`` as floats (empty: one fixed alpha). Raises
        BuildConfigError for a value that is not a number in [0, 1]."""
        text = self.smoothquant_alpha_grid.strip()
        if text == "auto":
            return tuple(i / 10 for i in range(11))
        alphas = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            try:
                alpha = float(part)
            except ValueError:
                alpha = -1.0
            if not 0.0 <= alpha <= 1.0:
                raise BuildConfigError(
                    f"--smoothquant-alpha-grid takes numbers in [0, 1] or 'auto', got {part!r}"
                )
            alphas.append(alpha)
        return tuple(alphas)

    @property
    def exclude_patterns(self) -> tuple[str, ...]:
        """``--exclude`` split into fnmatch patterns; unset means the default of ``--quant``."""
        value = self.exclude
        if value is None:
            value = _defaults(self.quant).exclude
        return tuple(p.strip() for p in value.split(",") if p.strip())

    def quant_spec(self, bound_pairs: bool = False) -> QuantSpec:
        """The quantization options (defaults of ``--quant`` resolved) as a ``QuantSpec``;
        ``bound_pairs``: int8 weight pairs within 128 (CPU hosts without VNNI)."""
        return QuantSpec(
            quant=self.quant,
            calib_method=self.calib_method_for_quant,
            smoothquant_alpha=self.smoothquant_alpha,
            smoothquant_alphas=self.smoothquant_alphas,
            int4_block_size=self.int4_block_size,
            int4_method=self.int4_method,
            weight_rounding=self.weight_rounding,
            weight_only8=self.weight_only8_patterns,
            exclude=self.exclude_patterns,
            kv_cache_dtype=self.kv_cache_dtype,
            bound_pairs=bound_pairs,
        )

    def output_dir(self, model_id: str) -> Path:
        """The engine directory this build writes."""
        if self.output:
            return Path(self.output)
        return Path("engines") / f"{model_id}-{self.arch}-{self.dtype}-{self.quant}"

    def to_dict(self) -> dict:
        return asdict(self)

    def hash(self) -> str:
        """sha256 of the options that change the engine's bytes (not where it is written)."""
        # The provider is recorded beside the hash (manifest, registry index), not in the graph.
        skip = {"output", "registry", "timing_cache", "execution_provider"}
        if self.arch == CPU_TARGET:  # TensorRT options do not touch cpu engines
            skip |= {"builder_opt_level", "hardware_compat"}
        d = {k: v for k, v in self.to_dict().items() if k not in skip}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_sources(cls, yaml_path: str | None, cli: dict) -> BuildConfig:
        """Merge: defaults < YAML file < command line. Raises BuildConfigError on unknown keys
        or an unreadable file."""
        values: dict = {}
        if yaml_path:
            import yaml

            try:
                loaded = yaml.safe_load(Path(yaml_path).read_text()) or {}
            except (OSError, yaml.YAMLError) as e:
                raise BuildConfigError(f"cannot read build config {yaml_path}: {e}") from e
            if not isinstance(loaded, dict):
                raise BuildConfigError(f"{yaml_path} must hold a mapping of option: value")
            values.update({k.replace("-", "_"): v for k, v in loaded.items()})
        values.update(cli)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise BuildConfigError(
                f"unknown build option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        config = cls(**values)
        config.validate()
        return config
