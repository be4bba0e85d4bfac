"""Exported engine graphs of meta-device models, cached by everything that determines them.

A streamed build exports its model on the meta device (``streamed_export``): the graph is then a
function of the model's class and config, the KV block size, the adapter slots and the code
(llmc's Python sources; torch, transformers, onnxscript, onnx-ir and onnx), never of the weights,
which ``checkpoint_weights.bind_initializers`` binds afterwards. ``torch.onnx.export`` is most of
a small model's build (a 2-layer test model: 21 of 26 s on a 2-core host) and a fixed cost of
every build of a checkpoint (one per ``--quant`` and ``--arch``). The cache keeps each graph with
every initializer an unbound external reference (name, dtype and shape; no bytes) under
``cache_home()/exports``, keyed by a SHA-256 of all of the above.

The export is read back from the cache on a miss too, so a hit and a miss hand the build the same
graph. ``bind_initializers`` gives every initializer its tensor or raises, so an unbound
reference never reaches an engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx_ir as ir
from google.protobuf.message import DecodeError

import llmc
from llmc.cache_home import cache_home

#: The packages whose code turns a model into the graph.
EXPORT_PACKAGES = ("torch", "transformers", "onnxscript", "onnx-ir", "onnx")
#: Where an initializer of a cached graph points until its checkpoint tensor is bound.
UNBOUND = "llmc-unbound-weight"
#: Config fields that name the checkpoint, not the model (the graph is the same without them).
_CHECKPOINT_FIELDS = ("_name_or_path", "_commit_hash", "transformers_version")


def cached_export(
    model: Any, block_size: int, lora: Any, export: Callable[[], ir.Model], root: Path | None = None
) -> ir.Model:
    """The graph ``export()`` returns for the meta-device transformers ``model`` exported with
    ``block_size``-token KV blocks and the adapter slots ``lora`` (an ``onnx_export.LoRASlots``
    or None), read from ``root`` (default ``cache_home() / "exports"``) when cached there, else
    exported, cached and read back. Every initializer of the result has an unbound external
    reference for its value (``UNBOUND``), for ``bind_initializers`` to replace.

    A cached file that does not parse is exported again. Raises whatever ``export`` raises;
    OSError when the cache cannot be written.
    """
    root = cache_home() / "exports" if root is None else root
    path = root / f"{export_key(model, block_size, lora)}.onnx"
    if path.is_file():
        try:
            return ir.load(path)
        except DecodeError:  # a damaged entry is exported again
            path.unlink(missing_ok=True)
    _store(export(), path)
    return ir.load(path)


def export_key(model: Any, block_size: int, lora: Any) -> str:
    """SHA-256 (hex) of what the meta-device export of ``model`` depends on: its class, its
    config less the checkpoint's name (``_CHECKPOINT_FIELDS``), ``block_size``, ``lora``, the
    versions of ``EXPORT_PACKAGES`` and of Python, and the digest of llmc's Python sources."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in _CHECKPOINT_FIELDS}
    parts = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": config,
        "block_size": block_size,
        "lora": None if lora is None else asdict(lora),
        "packages": {name: metadata.version(name) for name in EXPORT_PACKAGES},
        "python": platform.python_version(),
        "llmc": source_digest(),
    }
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def source_digest(package: Path | None = None) -> str:
    """SHA-256 (hex) of every ``*.py`` file under ``package`` (default: llmc's own), by relative
    path and bytes: a change anywhere in llmc's Python is a new key."""
    package = Path(llmc.__file__).parent if package is None else package
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _store(model: ir.Model, path: Path) -> None:
    """Write ``model`` with its initializers unbound to ``path``, atomically: a temporary name,
    then a rename, so a concurrent build never reads half a file."""
    for name, value in model.graph.initializers.items():
        value.const_value = ir.ExternalTensor(
            UNBOUND,
            offset=0,
            length=0,
            dtype=value.dtype,
            shape=value.shape,
            name=name,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    ir.save(model, partial)
    os.replace(partial, path)
