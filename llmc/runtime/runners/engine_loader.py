"""Load an engine directory: manifest check first, then its files, then the runner (DESIGN §6).

Nothing is deserialized before the manifest has been checked against this host, so a mismatched
engine is refused with what to rebuild instead of failing somewhere inside ONNX Runtime.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from llmc.engine.files import PLAN_NAME, check_external_data, confine, plan_files
from llmc.engine.host import check_runs_here
from llmc.engine.kv_cache import kv_cache_dtype_of
from llmc.engine.manifest import (
    MANIFEST_NAME,
    EngineManifest,
    damaged_hint,
    parse_manifest,
    verify_files,
)
from llmc.engine.targets import target
from llmc.engine.targets.sm import SM_BACKENDS
from llmc.errors import EngineConfigError, EngineCorruptError, EngineError, EngineNotFoundError
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.runner import Runner

#: Default KV-cache memory budget when neither ``num_blocks`` nor ``kv_cache_memory`` is given.
DEFAULT_KV_CACHE_BYTES = 2 << 30


@dataclass
class LoadedEngine:
    """A checked, loaded engine: its manifest, a runner owning the KV cache, and the tokenizer."""

    manifest: EngineManifest
    runner: Runner
    tokenizer: object
    eos_token_ids: set[int]
    block_size: int


def kv_bytes_per_block(manifest: EngineManifest) -> int:
    """Bytes one KV block takes over all layers:
    2 (key, value) * layers * block_size * KVH * D * the cache element's size
    (``kv_cache_dtype_of``: 4 for float32, 2 for bfloat16/float16, 1 for fp8/int8)."""
    return (
        2
        * manifest.num_layers
        * manifest.block_size
        * manifest.num_kv_heads
        * manifest.head_dim
        * kv_cache_dtype_of(manifest).itemsize
    )


def plan_num_blocks(
    manifest,
    num_blocks: int | None,
    kv_cache_memory: int | None,
    max_model_len: int | None = None,
) -> int:
    """How many KV blocks to allocate.

    Default: enough for ``max_batch`` sequences of the build's ``max_seq_len``, capped by the
    memory budget (``kv_cache_memory`` bytes, default ``DEFAULT_KV_CACHE_BYTES``). The pool must
    hold one sequence of ``max_model_len`` tokens, the longest the engine will serve (None:
    ``max_seq_len``).

    Raises:
        EngineConfigError: (a ValueError) ``max_model_len`` exceeds the build's ``max_seq_len``.
        EngineError: the pool cannot hold one ``max_model_len`` sequence; the message names the
            settings to change.
    """
    max_seq_len = manifest.max_seq_len
    if max_model_len is None:
        max_model_len = max_seq_len
    if max_model_len > max_seq_len:
        raise EngineConfigError(
            f"max_model_len {max_model_len} exceeds the engine's max_seq_len {max_seq_len}; "
            "rebuild the engine with a larger max_seq_len"
        )
    block_size = manifest.block_size
    if num_blocks is None:
        budget = kv_cache_memory or DEFAULT_KV_CACHE_BYTES
        per_seq = math.ceil(max_seq_len / block_size)
        num_blocks = min(per_seq * manifest.max_batch, budget // kv_bytes_per_block(manifest))
    needed = math.ceil(max_model_len / block_size)
    if num_blocks < needed:
        raise EngineError(
            f"a KV pool of {num_blocks} blocks of {block_size} tokens cannot hold one "
            f"sequence of max_model_len={max_model_len} ({needed} blocks); raise "
            "--kv-cache-memory (num_blocks), lower --max-model-len, or rebuild with a smaller "
            "--max-seq-len"
        )
    return num_blocks


def load_engine(
    path: str | Path,
    *,
    num_blocks: int | None = None,
    kv_cache_memory: int | None = None,
    threads: int | None = None,
    verify_digests: bool = True,
    max_model_len: int | None = None,
    expected_manifest_sha256: str | None = None,
) -> LoadedEngine:
    """Check and load the engine at ``path``, its KV pool sized by ``plan_num_blocks`` for
    sequences of at most ``max_model_len`` tokens (None: the build's ``max_seq_len``).
    ``verify_digests=False`` skips hashing the files, not the other checks of
    ``check_engine_files``. ``expected_manifest_sha256`` (hex), when given, is the digest
    ``manifest.json`` must have: the one the registry checked when it resolved the engine
    (``ResolvedEngine.manifest_sha256``), so a manifest swapped since is refused.

    Raises EngineNotFoundError (no engine there), EngineMismatchError (built for another
    target/ISA/backend; says what to rebuild), EngineCorruptError (``manifest.json`` does not
    hash to ``expected_manifest_sha256``; see ``check_engine_files``), EngineConfigError or
    EngineError (see ``plan_num_blocks``; before any engine file is read).
    """
    engine_dir = Path(path)
    manifest_path = engine_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise EngineNotFoundError(
            f"{engine_dir} is not an engine directory (no manifest.json); build one with "
            "`llmc build MODEL --arch cpu -o DIR`"
        )
    raw = manifest_path.read_bytes()  # read once: the bytes checked are the bytes parsed
    if expected_manifest_sha256 is not None:
        _check_manifest_digest(raw, expected_manifest_sha256, manifest_path)
    manifest = parse_manifest(raw, str(manifest_path))
    check_runs_here(manifest)
    provider = manifest.provider
    blocks = plan_num_blocks(manifest, num_blocks, kv_cache_memory, max_model_len)
    check_engine_files(manifest, engine_dir, hash_files=verify_digests)
    from transformers import AutoTokenizer

    if target(manifest.target).backend in SM_BACKENDS:
        from llmc.runtime.runners.trt_runner import TrtRunner  # imports torch

        runner = TrtRunner(engine_dir, manifest, num_blocks=blocks)
    else:
        runner = cpu_runner(engine_dir, blocks, threads, provider)
    tokenizer = AutoTokenizer.from_pretrained(str(engine_dir / "tokenizer"))
    gen = json.loads((engine_dir / "generation_config.json").read_text())
    return LoadedEngine(
        manifest=manifest,
        runner=runner,
        tokenizer=tokenizer,
        eos_token_ids=set(gen.get("eos_token_id") or []),
        block_size=manifest.block_size,
    )


def check_engine_files(manifest: EngineManifest, engine_dir: Path, hash_files: bool = True) -> None:
    """Check an engine directory's files against its manifest (an ``EngineManifest``) before
    any of them is deserialized: exactly the listed files, each confined to the directory and
    (``hash_files``) of its sha256; the ONNX files ``plan.json`` names (or the TensorRT plan the
    manifest names) among them; no ONNX file's external data outside the directory.

    Raises:
        EngineCorruptError: naming the file at fault and the command that rebuilds the engine
            (``llmc.engine.files`` lists each fault).
    """
    todo = damaged_hint(manifest)
    verify_files(manifest, engine_dir, hash_files)
    if manifest.backend in SM_BACKENDS:
        where = engine_dir / MANIFEST_NAME
        named = [(manifest.tensorrt or {}).get("plan", "engine.plan")]
        confine(engine_dir, named[0], f"{where} (tensorrt.plan)", todo)
    else:
        where = engine_dir / PLAN_NAME
        named = plan_files(engine_dir, todo)
    for relative in named:
        if relative not in manifest.files:
            raise EngineCorruptError(
                f"{where} names {relative!r}, which the manifest does not list; {todo}"
            )
    for relative in manifest.files:
        if relative.endswith(".onnx"):
            check_external_data(engine_dir, relative, todo)


def _check_manifest_digest(raw: bytes, expected: str, path: Path) -> None:
    """Refuse a ``manifest.json`` (bytes ``raw``, read from ``path``) whose sha256 is not
    ``expected``."""
    actual = hashlib.sha256(raw).hexdigest()
    if actual != expected:
        raise EngineCorruptError(
            f"{path} hashes to sha256:{actual}, but the engine was resolved with the manifest "
            f"sha256:{expected}; it was replaced after it was checked. Refusing it: delete "
            f"{path.parent} if it is a registry checkout (it is assembled again from the "
            "registry's blobs) and run `llmc registry verify`"
        )
