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
DTYPES = ("float32", "bfloat16")
QUANTS = ("none", "fp8", "int8", "int4")


def _opt(default, help: str, choices: tuple | None = None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class BuildConfig:
    """Options of one engine build (see each field's help)."""

    model: str = _opt("gemma-3-270m", "HF checkpoint dir (safetensors), .gguf file, or alias")
    arch: str = _opt(CPU_TARGET, "target: cpu (this host's ISA) or a GPU arch", TARGETS)
    dtype: str = _opt("float32", "compute and weight dtype of the engine", DTYPES)
    quant: str = _opt("none", "weight/activation quantization", QUANTS)
    max_seq_len: int = _opt(4096, "longest sequence (prompt + output tokens) the engine serves")
    max_num_tokens: int = _opt(2048, "most tokens in one step (the scheduler's token budget)")
    max_batch: int = _opt(16, "most sequences in one step")
    block_size: int = _opt(16, "tokens per KV-cache block")
    threads: int = _opt(2, "CPU threads used to optimize and run the engine")
    output: str | None = _opt(
        None, "engine directory (default: engines/<model>-<arch>-<dtype>-<quant>)"
    )

    def validate(self) -> None:
        """Raise BuildConfigError naming the bad option and the allowed values."""
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise BuildConfigError(
                    f"--{f.name.replace('_', '-')} {value!r} is not one of {', '.join(choices)}"
                )
        for name in ("max_seq_len", "max_num_tokens", "max_batch", "block_size", "threads"):
            if getattr(self, name) < 1:
                raise BuildConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.quant != "none":
            raise BuildConfigError(
                f"--quant {self.quant} is not implemented yet; build with --quant none"
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
        d = {k: v for k, v in self.to_dict().items() if k != "output"}
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
