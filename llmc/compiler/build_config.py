"""``BuildConfig``: every option of ``llmc build``, one documented field each.

The CLI's flags and help come from these fields; ``--config build.yaml`` may set any field and
the command line wins (as ``vllm serve --config`` does).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from llmc.errors import BuildConfigError

CPU_TARGET = "cpu"
GPU_TARGETS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")
TARGETS = (CPU_TARGET, *GPU_TARGETS)
DTYPES = ("float32", "bfloat16", "float16")
CPU_DTYPES = ("float32", "bfloat16")
# TensorRT IBuilderConfig.hardware_compatibility_level and builder_optimization_level values.
HARDWARE_COMPAT = ("none", "ampere+", "same-cc")
BUILDER_OPT_LEVELS = range(0, 6)
QUANTS = ("none", "fp8", "int8", "int4")
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
INT4_METHODS = ("awq", "rtn")
WEIGHT_ROUNDINGS = ("gptq", "nearest")
INT4_BLOCK_SIZES = (32, 64, 128)
CALIB_METHODS = ("max", "percentile", "mse")
# Modules kept float32 or given 8-bit weight-only weights by default, measured on Gemma 3 270M
# (README):
# - every --quant: the vocabulary projection 8-bit weight-only. E4M3 weights (3 mantissa bits)
#   or 4-bit blocks of a 262,144-row projection flip the argmax (llama.cpp keeps its output
#   tensor at ~6 bits); under int8, MatMulNBits quantizes its input per block of 32 instead of
#   one per-tensor scale: top-1 92.13% -> 93.26%, S1 decode 2.07x -> 2.48x float32, S16 4.87x ->
#   4.28x HF eager on an AVX-512 VNNI host (session 8; `--weight-only8 ''` gives back W8A8).
# - int8: down_proj reads GELU(gate) * up, heavy-tailed (max / 99th percentile ~20-50 after
#   SmoothQuant), which per-tensor int8 cannot hold: mean KL 0.110 -> 0.028 without it. It stays
#   float32: as 8-bit weight-only it ran as MatMulNBits, 3x slower per FLOP than W8A8 in a
#   2,048-token prefill and no faster than float32 at 16 decodes on AVX2; float32 took the S16
#   prefill from 2.03 to 1.77 s at the same accuracy (KL 0.0220 -> 0.0205, top-1 90.4%).
# - int4: *.down_proj 8-bit too, as llama.cpp's Q4_K_M gives ffn_down more bits: KL 0.105 ->
#   0.076 and top-1 80.9% -> 82.8% at the same decode speed (session 7).
# Observer defaults, measured on Gemma 3 270M: percentile lowers int8's mean KL by ~20% against
# max (and beats mse: top-1 93.26% vs 91.10%); for fp8 (whose range is wide) max is better (KL
# 0.024 vs 0.040).
DEFAULT_CALIB_METHOD = {"int8": "percentile", "fp8": "max", "int4": "max"}
DEFAULT_WEIGHT_ONLY8 = {"int8": "lm_head", "fp8": "lm_head", "int4": "lm_head,*.down_proj"}
DEFAULT_EXCLUDE = {"int8": "*.down_proj", "fp8": "", "int4": ""}
# FP8 tensor cores arrive with Ada (sm89); the CPU target runs FP8 Q/DQ as emulation.
FP8_TARGETS = ("cpu", "sm89", "sm90", "sm100", "sm120")
EXECUTION_PROVIDERS = ("auto", "cpu", "openvino")


def _opt(default, help: str, choices: tuple | None = None):
    return field(default=default, metadata={"help": help, "choices": choices})


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
        "quantization as Q/DQ nodes: fp8 (W8A8 E4M3), int8 (W8A8, SmoothQuant), "
        "int4 (weight-only, block-wise, AWQ)",
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
        + "; ".join(f"{q}: {p or 'none'}" for q, p in DEFAULT_WEIGHT_ONLY8.items())
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
        "'lm_head,*.down_proj'); default per --quant: "
        + "; ".join(f"{q}: {p or 'none'}" for q, p in DEFAULT_EXCLUDE.items())
        + " ('' for none)",
    )
    calib_data: str | None = _opt(
        None, ".txt or .jsonl ('text' field); its first 80% calibrates (default: model samples)"
    )
    calib_samples: int = _opt(64, "calibration windows")
    calib_seq_len: int = _opt(256, "tokens per calibration window")
    calib_method: str | None = _opt(
        None,
        "activation range observer: max, percentile (99.99th), mse; default per --quant: "
        + "; ".join(f"{q}: {m}" for q, m in DEFAULT_CALIB_METHOD.items()),
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
        for name in ("quant", "kv_cache_dtype"):
            value = getattr(self, name)
            if "fp8" == value and self.arch not in FP8_TARGETS:
                raise BuildConfigError(
                    f"--{name.replace('_', '-')} fp8 needs FP8 tensor cores (sm89 or newer); "
                    f"{self.arch} has none: use int8 or int4, or a newer --arch"
                )
        if self.arch == CPU_TARGET and self.dtype not in CPU_DTYPES:
            raise BuildConfigError(
                f"--dtype {self.dtype} needs a GPU target (--arch sm80 ...); cpu engines are "
                f"{' or '.join(CPU_DTYPES)}"
            )
        if self.arch != CPU_TARGET and self.quant == "int4" and self.int4_block_size < 64:
            raise BuildConfigError(
                f"--int4-block-size {self.int4_block_size}: TensorRT supports INT4 blocks of 64 "
                "or 128 input channels; use --int4-block-size 64 or 128"
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
        if self.arch == CPU_TARGET and self.quant != "none" and self.dtype != "float32":
            raise BuildConfigError(
                f"--quant {self.quant} builds run their unquantized parts in float32 on cpu; "
                "use --dtype float32"
            )

    @property
    def calib_method_for_quant(self) -> str:
        """``--calib-method``, or the default of ``--quant``."""
        return self.calib_method or DEFAULT_CALIB_METHOD.get(self.quant, "max")

    @property
    def weight_only8_patterns(self) -> tuple[str, ...]:
        """``--weight-only8`` split into patterns; unset means the default of ``--quant``."""
        value = self.weight_only8
        if value is None:
            value = DEFAULT_WEIGHT_ONLY8.get(self.quant, "")
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
            value = DEFAULT_EXCLUDE.get(self.quant, "")
        return tuple(p.strip() for p in value.split(",") if p.strip())

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
