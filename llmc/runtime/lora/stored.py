"""Adapters stored with an engine (``lora/<name>/`` in its directory, ``llmc lora add``): loaded
with the engine, signed and shipped with it by the registry."""

from __future__ import annotations

import shutil
from pathlib import Path

from llmc.engine.lora import (
    ADAPTER_CONFIG,
    ADAPTER_NAME,
    ADAPTER_WEIGHTS,
    ADAPTERS_DIR,
    LoRALayout,
    stored_adapters,
)
from llmc.engine.manifest import read_manifest
from llmc.runtime.lora.errors import LoRAAdapterError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.lora.peft_adapter import PeftAdapter, load_peft_adapter


def store_adapter(engine_dir: str | Path, name: str, adapter_dir: str | Path) -> PeftAdapter:
    """Check the PEFT directory ``adapter_dir`` against the engine's LoRA slots and copy its
    two files to ``engine_dir/lora/<name>/``; the adapter.

    Raises:
        LoRAAdapterError: a name outside ``[A-Za-z0-9._-]`` (starting alphanumeric), a name
            already stored, an engine without LoRA slots, or an adapter it cannot serve
            (``load_peft_adapter``).
        EngineError: no engine manifest in ``engine_dir``.
    """
    if not ADAPTER_NAME.fullmatch(name):
        raise LoRAAdapterError(f"adapter name {name!r}: use letters, digits, '.', '_', '-'")
    record = read_manifest(engine_dir).lora
    if not record:
        raise LoRAAdapterError(
            f"{engine_dir} has no LoRA slots; rebuild it with `llmc build MODEL --enable-lora`"
        )
    target = Path(engine_dir) / ADAPTERS_DIR / name
    if target.exists():
        raise LoRAAdapterError(f"{target} exists: adapter {name!r} is already stored")
    adapter = load_peft_adapter(name, adapter_dir, LoRALayout.from_dict(record))
    staging = target.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for file in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        shutil.copyfile(Path(adapter_dir) / file, staging / file)
    staging.rename(target)
    return adapter


def stored_lora_requests(engine_dir: str | Path) -> list[LoRARequest]:
    """A ``LoRARequest`` per adapter stored with the engine, by name (ids 1, 2, ...)."""
    return [
        LoRARequest(name, i, str(path))
        for i, (name, path) in enumerate(stored_adapters(engine_dir).items(), start=1)
    ]
