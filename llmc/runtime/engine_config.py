"""``EngineConfig``: how the engine serves one engine directory, and its defaults from the
engine's manifest."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.runtime.runners.engine_loader import LoadedEngine
from llmc.runtime.scheduling.scheduler_config import SchedulerConfig
from llmc.runtime.serving_defaults import default_decode_wait, default_step_tokens


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine serves one engine directory.

    Attributes:
        block_size: tokens per KV block; must equal the runner's.
        num_blocks: KV blocks the scheduler may use; at most the runner's cache size.
        max_model_len: longest sequence (prompt + output) in tokens; at most the engine's
            ``max_seq_len``.
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: most tokens in one step (prompt chunks + decodes).
        max_num_forked_seqs: most running completions 1..n-1 of n > 1 requests, so a large-n
            request cannot crowd out new ones; None: half of ``max_num_seqs`` (at least 1).
        seed: seed of the sampler's generator for requests without a seed of their own; None
            seeds it from the operating system.
        enable_prefix_caching: reuse the KV blocks of earlier requests with the same prefix
            (vLLM's automatic prefix caching); False computes every prompt from scratch.
        max_decode_wait_steps: prefill-first scheduling, as `SchedulerConfig`; 0: decodes
            first.
        max_loras: a LoRA engine's adapter slots (the most distinct adapters in one step);
            None: an engine without LoRA.
    """

    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_num_forked_seqs: int | None = None
    seed: int | None = None
    enable_prefix_caching: bool = True
    max_decode_wait_steps: int = 0
    max_loras: int | None = None

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_forked_seqs=self.max_num_forked_seqs,
            enable_prefix_caching=self.enable_prefix_caching,
            max_decode_wait_steps=self.max_decode_wait_steps,
            max_loras=self.max_loras,
        )


def engine_config_for(
    loaded: LoadedEngine,
    *,
    max_model_len: int | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_num_forked_seqs: int | None,
    max_decode_wait_steps: int | None,
    enable_prefix_caching: bool,
    seed: int | None,
) -> EngineConfig:
    """The `EngineConfig` of a loaded engine: its block size and pool; a limit given as None
    is the manifest's (``max_seq_len``, ``max_batch``) or its serving default
    (``serving_defaults``). Used by `LLMEngine.from_engine_dir`."""
    manifest = loaded.manifest
    return EngineConfig(
        block_size=loaded.block_size,
        num_blocks=loaded.runner.num_blocks,
        max_model_len=_or(max_model_len, manifest.max_seq_len),
        max_num_seqs=_or(max_num_seqs, manifest.max_batch),
        max_num_batched_tokens=_or(max_num_batched_tokens, default_step_tokens(manifest)),
        max_num_forked_seqs=max_num_forked_seqs,
        max_decode_wait_steps=_or(max_decode_wait_steps, default_decode_wait(manifest)),
        seed=seed,
        enable_prefix_caching=enable_prefix_caching,
        max_loras=manifest.lora["max_loras"] if manifest.lora else None,
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
