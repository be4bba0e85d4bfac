"""The portable stage of a TensorRT build: everything but the plan, on any host.

A GPU-target build first writes the engine graph as it will be given to TensorRT's parser, so a
host without TensorRT or without the right GPU can do the slow, GPU-independent part (export,
passes, calibration, Q/DQ, lowering, lint) and a GPU builder finishes it with
``llmc build --from STAGE --arch sm90``. Layout:

    stage.json                      StageManifest: build config, model facts, lint, file digests
    model.onnx, model.onnx.data     the lowered Q/DQ graph with plugin nodes (external weights)
    tokenizer/, generation_config.json
    calibration/stats.npz           quantized builds: the calibration statistics used (without
                                    the Gram matrices GPTQ consumed)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import onnx

from llmc.engine.files import sha256_file
from llmc.engine.manifest import ManifestCore, file_digests
from llmc.errors import LlmcError

#: 2: PagedAttention nodes with TensorRT's three outputs, ``aot`` and every plugin field, the
#: aliased caches as graph outputs, the AOT kernel's PTX ISA in ``metadata_props``.
STAGE_FORMAT_VERSION = 2
STAGE_KIND = "llmc-tensorrt-stage"
STAGE_NAME = "stage.json"
MODEL_FILE = "model.onnx"
CALIBRATION_FILE = "calibration/stats.npz"


class StageError(LlmcError):
    """A stage directory is missing, damaged, or does not match the requested build."""


@dataclass(kw_only=True)
class StageManifest(ManifestCore):
    """What a portable stage holds (``stage.json``): the facts its engine manifest copies
    (``ManifestCore``, with ``target`` "sm80" ... "sm120"), the calibration statistics and the
    TensorRT lint report."""

    format_version: int = STAGE_FORMAT_VERSION
    kind: str = STAGE_KIND
    calibration_stats: str | None = None  # CALIBRATION_FILE when present
    lint: dict = field(default_factory=dict)  # LintReport.to_dict() at write time


def write_stage(model: onnx.ModelProto, m: StageManifest, stage_dir: Path) -> None:
    """Save ``model`` (weights as external data, ``model.onnx.data``) into ``stage_dir``, which
    already holds the tokenizer files, then record every file's digest and write ``stage.json``
    atomically. ``model`` is modified (its tensors point at the external file afterwards)."""
    onnx.save(
        model,
        str(stage_dir / MODEL_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=MODEL_FILE + ".data",
        size_threshold=1024,
    )
    m.files = {k: v for k, v in file_digests(stage_dir).items() if k != STAGE_NAME}
    text = json.dumps(asdict(m), indent=2) + "\n"
    fd, partial = tempfile.mkstemp(prefix=".stage.", suffix=".tmp", dir=stage_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, stage_dir / STAGE_NAME)


def read_stage(stage_dir: str | Path, verify: bool = True) -> StageManifest:
    """Read ``stage_dir/stage.json`` and (``verify``) check every file's sha256.

    Raises StageError when the directory or manifest is missing, unreadable, of another format,
    or a file is missing or differs from its digest; the message says what to rebuild.
    """
    stage_dir = Path(stage_dir)
    path = stage_dir / STAGE_NAME
    rebuild = (
        "write a new one with `llmc build MODEL --arch smXX` (without TensorRT it stops there)"
    )
    if not path.is_file():
        raise StageError(f"{stage_dir} is not a portable stage (no {STAGE_NAME}); {rebuild}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StageError(f"{path} is unreadable ({e}); {rebuild}") from e
    if not isinstance(data, dict) or data.get("kind") != STAGE_KIND:
        raise StageError(f"{path} is not an llmc TensorRT stage manifest; {rebuild}")
    if data.get("format_version") != STAGE_FORMAT_VERSION:
        raise StageError(
            f"{path}: stage format {data.get('format_version')!r}, this llmc reads "
            f"{STAGE_FORMAT_VERSION}; {rebuild}"
        )
    known = {f.name for f in fields(StageManifest)}
    try:
        m = StageManifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as e:
        raise StageError(f"{path} is incomplete ({e}); {rebuild}") from e
    if verify:
        for relative, digest in m.files.items():
            file = stage_dir / relative
            if not file.is_file() or sha256_file(file) != digest:
                state = "is missing" if not file.is_file() else "differs from its digest"
                raise StageError(f"stage file {file} {state}; the stage is damaged: {rebuild}")
    return m


def check_request(m: StageManifest, requested: dict) -> None:
    """Refuse finishing a stage with options that contradict it: ``requested`` holds the
    options given with ``--from`` (arch, quant, dtype, kv_cache_dtype). Raises StageError."""
    for name in ("arch", "quant", "dtype", "kv_cache_dtype"):
        if name not in requested or requested[name] is None:
            continue
        have = m.build_config.get(name)
        if requested[name] != have:
            flag = f"--{name.replace('_', '-')}"
            raise StageError(
                f"the stage was built with {flag} {have} but {flag} {requested[name]} was asked; "
                f"finish it with {flag} {have}, or build a new stage with `llmc build "
                f"{m.source} {flag} {requested[name]} ...`"
            )
