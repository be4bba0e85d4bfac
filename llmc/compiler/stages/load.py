"""Resolve a checkpoint (files, tokenizer, digest), then load its weights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmc.compiler.config.source import SourceOptions
from llmc.compiler.frontend.model_source import (
    ModelSource,
    load_model,
    load_tokenizer,
    resolve_model,
    sha256_files,
)
from llmc.compiler.frontend.streamed_export import MetaModel, meta_model
from llmc.compiler.memory.plan import MemoryPlan
from llmc.compiler.stages.progress import Stage, no_stage
from llmc.compiler.stages.tokenizer import generation_config
from llmc.engine.kv_cache import CacheSpec, cache_spec


@dataclass(frozen=True)
class ResolvedModel:
    """A checkpoint located and its tokenizer loaded; no weight read yet."""

    source: ModelSource
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    checkpoint_digest: str  # sha256 (hex) over the weight files

    @property
    def model_id(self) -> str:
        """The short name recorded in the manifest (alias or directory/file stem)."""
        return self.source.model_id


@dataclass(frozen=True)
class LoadedModel:
    """The checkpoint's weights as a float32 transformers model, its attention routed to the
    plugin op (``load_model``), and what the engine records of it."""

    resolved: ResolvedModel
    hf_model: Any  # transformers PreTrainedModel, float32, eval mode (meta device if streamed)
    cache: CacheSpec  # num_layers, num_kv_heads, head_dim
    vocab_size: int
    generation: dict[str, Any]  # generation_config.json, every end-of-sequence id
    streamed: MetaModel | None = None  # set: weights stay in the checkpoint (streamed_export)

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer."""
        return self.resolved.tokenizer


def resolve(options: SourceOptions, stage: Stage = no_stage) -> ResolvedModel:
    """Locate ``options.model``, load its tokenizer and digest its weight files. Raises
    ModelSourceError for a bad path or alias."""
    with stage("resolve model"):
        src = resolve_model(options.model)
        digest = sha256_files(src.weight_files)
        return ResolvedModel(src, load_tokenizer(src, digest), digest)


def load(
    resolved: ResolvedModel, stage: Stage = no_stage, memory: MemoryPlan | None = None
) -> LoadedModel:
    """Read the weights in float32: cpu engines keep float32 weights (bfloat16 is the
    provider's compute precision) and calibration runs the float32 graph on the CPU. When
    ``memory`` says the build streams, build the model on the meta device instead and leave
    the weights in the checkpoint (``streamed_export``)."""
    meta = None
    with stage("load weights"):
        if memory is not None and memory.streamed:
            meta = meta_model(resolved.source, resolved.checkpoint_digest)
            model = meta.model
        else:
            model = load_model(resolved.source, "float32")
    return LoadedModel(
        resolved,
        model,
        cache_spec(model),
        int(model.config.vocab_size),
        generation_config(resolved.source, model, resolved.tokenizer),
        meta,
    )
