"""``SourceOptions``: the checkpoint an engine is built from, and the engine's dtype."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.option import check_choices, option
from llmc.engine import targets as tg
from llmc.engine.targets.cpu import CPU

DTYPES = tuple(dict.fromkeys(d for t in tg.TARGETS.values() for d in t.dtypes))
CPU_DTYPES = CPU.dtypes


@dataclass(frozen=True)
class SourceOptions:
    """The model: which checkpoint, and the dtype its engine computes in."""

    model: str = option("gemma-3-270m", "HF checkpoint dir (safetensors), .gguf file, or alias")
    dtype: str | None = option(
        None,
        "compute and weight dtype of the engine; default float32 on cpu, bfloat16 on GPU "
        "targets (float16 is GPU-only)",
        DTYPES,
    )

    def validate(self) -> None:
        """Raise BuildConfigError for a dtype that is not one of ``DTYPES``."""
        check_choices(self)
