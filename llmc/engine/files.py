"""An engine directory's files: confined to it, exactly those its manifest lists, as listed.

Checked by the loader before anything in the directory is deserialized (DESIGN §6):

- every path the manifest or ``plan.json`` names is a canonical relative POSIX path (not
  absolute, no ``..``, ``.`` or empty part) that resolves, symbolic links followed, inside the
  directory;
- the files under the directory are exactly the manifest's list: a file it does not list, or one
  it lists that is absent, is refused, as is a manifest that lists no files;
- every listed file is a regular file whose sha256 is the listed digest;
- every ONNX file's external-data locations resolve inside the directory (ONNX Runtime refuses
  some escapes only with its own raw error, and would read others).

Hashing is the cost: Gemma 3 270M's float32 engine (1.78 GB in 44 files) takes 1.2 s of CPU
(sha256 with SHA-NI, one core of an AMD EPYC with AVX-512, warm page cache) against ~3.9 s for
ONNX Runtime to load it, and the pages hashed are the ones ORT reads next. So no digest cache is
kept: one keyed on file metadata would trust whoever can write the directory and reset mtimes.
This module takes plain data (the manifest's ``files`` and what to tell the user); the manifest
module (``llmc.engine.manifest``) builds on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from llmc.errors import EngineCorruptError

MANIFEST_NAME = "manifest.json"
#: Where ``llmc build --draft`` puts the draft engine inside the engine directory.
DRAFT_DIR = "draft"
PLAN_NAME = "plan.json"
_CHUNK_BYTES = 1 << 20


def confine(engine_dir: str | Path, relative: object, where: str, todo: str) -> Path:
    """The path of ``relative`` (named by ``where``, e.g. "plan.json") inside ``engine_dir``.

    Raises:
        EngineCorruptError: ``relative`` is not a canonical relative POSIX path, or it resolves
            (symbolic links followed) outside ``engine_dir``; the message names it and ``todo``.
    """
    root = Path(engine_dir).resolve()
    if not isinstance(relative, str) or not _is_canonical(relative):
        raise EngineCorruptError(
            f"{where} names the path {relative!r}, which is not a plain path inside the engine "
            f"directory {root} (absolute, '..', '.' or empty part); {todo}"
        )
    try:
        target = (root / relative).resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a symbolic link loop (3.11)
        raise EngineCorruptError(
            f"{where} names {relative!r}, which cannot be resolved ({error}); {todo}"
        ) from error
    if not target.is_relative_to(root):
        raise EngineCorruptError(
            f"{where} names {relative!r}, which resolves to {target}, outside the engine "
            f"directory {root} (a symbolic link leads out of it); {todo}"
        )
    return root / relative


def list_files(engine_dir: str | Path) -> list[str]:
    """Every file under ``engine_dir`` (symbolic links included, not followed) by relative POSIX
    path, sorted; the manifest and its temporary files (``write_manifest``) are left out."""
    root = Path(engine_dir)
    found = []
    for folder, dirs, files in os.walk(root):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in (*files, *links):
            found.append(Path(folder, name).relative_to(root).as_posix())
    return sorted(f for f in found if not _is_manifest(f))


def verify_engine_files(
    files: dict[str, str],
    engine_dir: str | Path,
    todo: str,
    hash_files: bool = True,
    nested: tuple[str, ...] = (),
) -> None:
    """Check that ``engine_dir`` holds exactly ``files`` (relative path -> sha256 hex), each
    confined to it, a regular file and, with ``hash_files``, of the listed digest. The listing
    is compared before any file is hashed, so a wrong directory is refused at once. Files under
    the ``nested`` folders (a draft engine, checked by its own manifest) are not compared.

    Raises:
        EngineCorruptError: the list is empty; a listed path escapes the directory; a file is
            absent, unlisted, not a regular file, or differs from its digest (both digests
            named). Each message names the file and ends with ``todo``.
    """
    root = Path(engine_dir)
    where = f"{root / MANIFEST_NAME}"
    if not files:
        raise EngineCorruptError(f"{where} lists no engine files, so none can be checked; {todo}")
    paths = {relative: confine(root, relative, where, todo) for relative in files}
    prefixes = tuple(f"{folder}/" for folder in nested)
    unlisted = [f for f in list_files(root) if f not in files and not f.startswith(prefixes)]
    if unlisted:
        raise EngineCorruptError(
            f"engine file {root / unlisted[0]} is not in the manifest"
            f"{f' (nor are {len(unlisted) - 1} more)' if len(unlisted) > 1 else ''}; an engine "
            f"directory holds only the files its manifest lists: remove it if it was added "
            f"by hand; otherwise {todo}"
        )
    for path in paths.values():
        if not path.is_file():  # follows a confined link; False for a FIFO, device, folder
            what = "is missing" if not path.exists() else "is not a regular file"
            raise EngineCorruptError(f"engine file {path} (in the manifest) {what}; {todo}")
    if not hash_files:
        return
    for relative, expected in files.items():
        actual = sha256_file(paths[relative])
        if actual != expected:
            raise EngineCorruptError(
                f"engine file {paths[relative]} has sha256 {actual}, but the manifest expects "
                f"{expected}; {todo}"
            )


def plan_files(engine_dir: str | Path, todo: str) -> list[str]:
    """The ONNX files ``plan.json`` points the runner at (its segments, then its graph, if
    any), each checked with ``confine``. Raises EngineCorruptError for a plan that is not
    JSON of the expected shape, or a path that escapes."""
    path = Path(engine_dir) / PLAN_NAME
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        named = [s["file"] for s in plan["segments"]]
        named += [plan["graph"]] if plan.get("graph") else []
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise EngineCorruptError(f"{path} is unreadable or malformed ({e!r}); {todo}") from e
    for relative in named:
        confine(engine_dir, relative, str(path), todo)
    return named


def check_external_data(engine_dir: str | Path, onnx_file: str, todo: str) -> None:
    """Refuse an ONNX file whose tensors' external data lies outside ``engine_dir``. Reads the
    graph only (``load_external_data=False``); a location is relative to the ONNX file's folder.

    Raises:
        EngineCorruptError: the file does not parse as ONNX, or an external-data location is not
            a plain relative path or resolves outside the directory; names the file and location.
    """
    import onnx

    root = Path(engine_dir)
    path = root / onnx_file
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf's DecodeError and onnx's errors share no base
        raise EngineCorruptError(f"{path} is not a readable ONNX file ({error}); {todo}") from error
    folder = PurePosixPath(onnx_file).parent
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        where = f"{path}: the external data of tensor {tensor.name!r}"
        if not _is_canonical(location):
            raise EngineCorruptError(
                f"{where} is at {location!r}, not a plain path beside the graph (absolute, '..' "
                f"or empty); it would be read from outside the engine directory; {todo}"
            )
        data = confine(root, (folder / location).as_posix(), where, todo)
        if not data.is_file():
            raise EngineCorruptError(f"{where} is at {location!r}, which is missing; {todo}")


def sha256_file(path: str | Path) -> str:
    """sha256 (hex) of a file, read in 1 MiB chunks so memory stays flat for GB files."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _tensors(graph):
    """Every TensorProto of ``graph``: initializers, sparse ones, node attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _is_canonical(relative: str) -> bool:
    parts = relative.split("/")
    return (
        bool(relative)
        and "\0" not in relative
        and not relative.startswith("/")
        and all(part not in ("", ".", "..") for part in parts)
    )


def _is_manifest(relative: str) -> bool:
    return relative == MANIFEST_NAME or (
        relative.startswith(f".{MANIFEST_NAME}.") and relative.endswith(".tmp")
    )
