"""Engine manifests written out in tests that check a host or a runner without building."""

from __future__ import annotations

from dataclasses import replace

from llmc.engine.manifest import EngineManifest


def make_manifest(target: str, backend: str, **changes) -> EngineManifest:
    """A manifest of a 2-layer model (vocabulary 512, 8-token blocks) for ``target`` run by
    ``backend``, float32 unless ``changes`` say otherwise (any field)."""
    m = EngineManifest(
        model_id="tiny",
        source="/models/tiny",
        checkpoint_digest="0" * 64,
        tokenizer_digest="0" * 64,
        target=target,
        isa=[],
        arch="x86_64",
        dtype="float32",
        quant="none",
        kv_cache_dtype="float32",
        max_seq_len=128,
        max_num_tokens=64,
        max_batch=4,
        block_size=8,
        num_layers=2,
        num_kv_heads=1,
        head_dim=32,
        vocab_size=512,
        backend=backend,
        backend_version="1.0.0",
        execution_provider="Dummy",
        build_config_hash="0" * 64,
    )
    return replace(m, **changes)
