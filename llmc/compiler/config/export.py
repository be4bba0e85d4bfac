"""``ExportOptions``: the limits an engine serves and the KV-cache block size its graph uses."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmc.compiler.config.option import check_at_least, option
from llmc.errors import BuildConfigError

#: The Linear modules given LoRA slots by default: every projection of a decoder layer.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: ExportOptions' LoRA options: left out of the build's hash when LoRA is off.
LORA_OPTIONS = ("enable_lora", "max_loras", "max_lora_rank", "lora_target_modules")

#: ``--max-seq-len`` when it is not given and the model was trained on at least this many
#: positions (else the model's ``max_position_embeddings``).
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass(frozen=True)
class ExportOptions:
    """The engine's shape: serving limits (tokens, sequences) and KV-cache block size."""

    max_seq_len: int | None = option(
        None,
        "longest sequence (prompt + output tokens) the engine serves; at most the model's "
        f"max_position_embeddings (default: that, up to {DEFAULT_MAX_SEQ_LEN})",
    )
    allow_long_max_seq_len: bool = option(
        False,
        "accept a --max-seq-len past the model's max_position_embeddings: a quality risk, as "
        "positions past the model's training length give degraded or meaningless output",
    )
    max_num_tokens: int = option(2048, "most tokens in one step (the scheduler's token budget)")
    max_batch: int = option(16, "most sequences in one step")
    block_size: int = option(16, "tokens per KV-cache block")
    enable_lora: bool = option(
        False,
        "reserve LoRA adapter slots in the engine (cpu): adapters from PEFT directories are "
        "served per request, mixed in one step (vLLM's --enable-lora)",
    )
    max_loras: int = option(4, "with --enable-lora: adapter slots, the most distinct in one step")
    max_lora_rank: int = option(16, "with --enable-lora: the largest adapter rank a slot holds")
    lora_target_modules: str = option(
        ",".join(LORA_TARGET_MODULES),
        "with --enable-lora: comma-separated module names adapters may target (PEFT's names)",
    )

    def validate(self) -> None:
        """Raise BuildConfigError for a limit below 1 or an empty LoRA target list."""
        given = ("max_seq_len",) if self.max_seq_len is not None else ()
        check_at_least(self, 1, *given, "max_num_tokens", "max_batch", "block_size")
        check_at_least(self, 1, "max_loras", "max_lora_rank")
        if self.enable_lora and not self.lora_targets:
            raise BuildConfigError("--lora-target-modules names no module")

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """``--lora-target-modules`` as a tuple of module names."""
        return tuple(m.strip() for m in self.lora_target_modules.split(",") if m.strip())

    def for_model(self, max_positions: int | None, source: str) -> ExportOptions:
        """These options with ``max_seq_len`` fitted to a model trained on ``max_positions``
        positions (None: unknown), as ``source`` (its config) says: an unset one becomes
        ``min(max_positions, DEFAULT_MAX_SEQ_LEN)``. Raises BuildConfigError for a
        ``max_seq_len`` past ``max_positions`` without ``allow_long_max_seq_len``."""
        if self.max_seq_len is None:
            fitted = min(max_positions or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
            return replace(self, max_seq_len=fitted)
        if max_positions is not None and self.max_seq_len > max_positions:
            if not self.allow_long_max_seq_len:
                raise BuildConfigError(
                    f"--max-seq-len {self.max_seq_len} is past the model's "
                    f"max_position_embeddings {max_positions} ({source}): positions past its "
                    f"training length give degraded or meaningless output; give --max-seq-len "
                    f"{max_positions} or less, or --allow-long-max-seq-len to build it anyway"
                )
        return self
