"""Store a weight that several engine segments read once (a tied embedding table).

Each segment is optimized by ONNX Runtime on its own and saved with its own external-data file,
so a tensor two segments read (the embedding ``Gather`` in the first, the vocabulary
projection's ``Gemm`` in the last, ``passes/tied_weights.py``) is written twice. This pass
points the later segments' copy at the first file that holds the same bytes and rewrites their
data files without it. ONNX external data names a file relative to the model (``location``) and
a byte range in it (``offset``, ``length``), so a segment may read a tensor from another
segment's file; ``single_graph.py`` then keeps one initializer for both uses.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo

#: Tensors are placed at multiples of this in a rewritten data file (page-aligned, as ONNX
#: Runtime aligns large initializers so that they can be memory-mapped).
ALIGNMENT = 4096


def _external(t: onnx.TensorProto) -> ExternalDataInfo | None:
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return ExternalDataInfo(t)


def point_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``t``'s external data ``length`` bytes at ``offset`` of ``location``."""
    t.data_location = onnx.TensorProto.EXTERNAL
    t.ClearField("raw_data")
    del t.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        entry = t.external_data.add()
        entry.key, entry.value = key, str(value)


def _digest(path: Path, offset: int, length: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left:
            chunk = f.read(min(left, 64 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def share_weights(segment_files: list[Path]) -> int:
    """Deduplicate external-data tensors across ``segment_files`` (saved ONNX models in one
    folder, in plan order); returns the bytes no longer stored. Tensors are compared by dtype,
    shape and the SHA-256 of their bytes; a later duplicate is pointed at the earliest file
    holding it. Raises OSError when a data file cannot be read or written."""
    seen: dict[tuple, list[tuple[str, int, int, str]]] = {}
    saved = 0
    for path in segment_files:
        model = onnx.load(str(path), load_external_data=False)
        moved: set[str] = set()
        for t in model.graph.initializer:
            info = _external(t)
            if info is None or info.length is None:
                continue
            key = (t.data_type, tuple(t.dims), info.length)
            data = path.parent / info.location
            digest = None
            for location, offset, length, known in seen.get(key, []):
                if location == info.location:
                    continue
                digest = digest or _digest(data, info.offset or 0, info.length)
                if digest == known:
                    point_external(t, location, offset, length)
                    moved.add(t.name)
                    saved += length
                    break
            if t.name not in moved:
                digest = digest or _digest(data, info.offset or 0, info.length)
                seen.setdefault(key, []).append(
                    (info.location, info.offset or 0, info.length, digest)
                )
        if moved:
            compact(path, model)
    return saved


def compact(path: Path, model: onnx.ModelProto) -> None:
    """Rewrite the data file of ``model`` (saved at ``path``; its own file is
    ``<path name>.data``) with only the tensors that still point into it, at new offsets, and
    save ``model``. Tensors pointing into other files are left as they are."""
    location = path.name + ".data"
    data = path.parent / location
    own = [
        t
        for t in model.graph.initializer
        if _external(t) is not None and ExternalDataInfo(t).location == location
    ]
    if own:
        tmp = data.with_name(data.name + ".tmp")
        with open(data, "rb") as src, open(tmp, "wb") as dst:
            for t in own:
                info = ExternalDataInfo(t)
                dst.seek(-(-dst.tell() // ALIGNMENT) * ALIGNMENT)
                offset = dst.tell()
                src.seek(info.offset or 0)
                left = info.length
                while left:
                    chunk = src.read(min(left, 64 << 20))
                    dst.write(chunk)
                    left -= len(chunk)
                point_external(t, location, offset, info.length)
        tmp.replace(data)
    elif data.exists():  # every tensor of this segment lives in another file
        data.unlink()
    onnx.save(model, str(path))
