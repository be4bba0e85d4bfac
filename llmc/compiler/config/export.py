"""``ExportOptions``: the limits an engine serves and the KV-cache block size its graph uses."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.option import check_at_least, option


@dataclass(frozen=True)
class ExportOptions:
    """The engine's shape: serving limits (tokens, sequences) and KV-cache block size."""

    max_seq_len: int = option(4096, "longest sequence (prompt + output tokens) the engine serves")
    max_num_tokens: int = option(2048, "most tokens in one step (the scheduler's token budget)")
    max_batch: int = option(16, "most sequences in one step")
    block_size: int = option(16, "tokens per KV-cache block")

    def validate(self) -> None:
        """Raise BuildConfigError for a limit below 1."""
        check_at_least(self, 1, "max_seq_len", "max_num_tokens", "max_batch", "block_size")
