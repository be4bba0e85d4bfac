"""Store a weight that several engine segments read once (a tied embedding table).

Each segment is optimized by ONNX Runtime on its own and saved with its own external-data file,
so a tensor two segments read (the embedding ``Gather`` in the first, the vocabulary
projection's ``Gemm`` in the last, ``passes/tied_weights.py``) is written twice.
``share_weights`` points the later segments' copy at the first file that holds the same bytes;
``compact_files``, once every pass has repointed what it will, rewrites the data files without
the bytes no one reads and moves every reference with them. ONNX external data names a file
relative to the model (``location``) and a byte range in it (``offset``, ``length``), so a
segment may read a tensor from another segment's file; ``single_graph.py`` then keeps one
initializer for both uses.
"""

from __future__ import annotations

import hashlib
import os
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


def share_weights(models: dict[Path, onnx.ModelProto]) -> int:
    """Point duplicate external-data tensors of ``models`` (saved ONNX models by path, in one
    folder, in plan order; loaded without their data) at the earliest file holding the same
    bytes; returns the bytes no longer stored. Tensors are compared by dtype, shape and the
    SHA-256 of their bytes. Only the protos change: ``compact_files`` then rewrites the data
    files and saves the models. Raises OSError when a data file cannot be read."""
    seen: dict[tuple, list[tuple[str, int, int, str]]] = {}
    saved = 0
    for path, model in models.items():
        for t in model.graph.initializer:
            info = _external(t)
            if info is None or info.length is None:
                continue
            key = (t.data_type, tuple(t.dims), info.length)
            digest = _digest(path.parent / info.location, info.offset or 0, info.length)
            known = [e for e in seen.get(key, []) if e[0] != info.location and e[3] == digest]
            if known:
                location, offset, length, _ = known[0]
                point_external(t, location, offset, length)
                saved += length
            else:
                seen.setdefault(key, []).append(
                    (info.location, info.offset or 0, info.length, digest)
                )
    return saved


def compact_files(models: dict[Path, onnx.ModelProto]) -> None:
    """Rewrite each data file that ``models`` (by path, in one folder) point into with only
    the byte ranges some model still reads, page-aligned (``ALIGNMENT``), point every
    reference at its range's new offset, and save every model. A model's own data file
    (``<path name>.data``) that no model reads any more is deleted.

    All references are rewritten together: a range another segment was pointed at moves
    with its file, so no reference is left at an offset of the file's old layout. Raises
    OSError when a data file cannot be read or written, ValueError when two ranges of one
    file overlap without being equal."""
    folder = next(iter(models)).parent
    ranges: dict[str, set[tuple[int, int]]] = {}
    for model in models.values():
        for t in model.graph.initializer:
            info = _external(t)
            if info is not None:
                ranges.setdefault(info.location, set()).add((info.offset or 0, info.length))
    moves: dict[tuple[str, int], int] = {}
    for location, kept in ranges.items():
        if any(length is None for _, length in kept):
            moves.update({(location, o): o for o, _ in kept})  # "to the end": leave the file
            continue
        moves.update(_rewrite(folder / location, sorted(kept)))
    for model in models.values():
        for t in model.graph.initializer:
            info = _external(t)
            if info is not None:
                offset = moves[info.location, info.offset or 0]
                point_external(t, info.location, offset, info.length)
    for path, model in models.items():
        own = path.parent / (path.name + ".data")
        if path.name + ".data" not in ranges and own.exists():
            own.unlink()
        onnx.save(model, str(path))


def _rewrite(data: Path, kept: list[tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Lay the sorted (offset, length) ranges ``kept`` of ``data`` out again: a range stays
    where it is when less than ``ALIGNMENT`` bytes lie unread before it (ONNX Runtime's own
    padding), else it moves to the next multiple of ``ALIGNMENT``. Returns {(file name, old
    offset): new offset}. The file is rewritten only when a range moves, else truncated after
    its last range, so a segment whose bytes are all still read is not copied."""
    layout, end = [], 0
    for (offset, length), following in zip(kept, [*kept[1:], None], strict=True):
        if following is not None and following[0] < offset + length:
            raise ValueError(f"{data}: ranges {offset}+{length} and {following} overlap")
        new = offset if 0 <= offset - end < ALIGNMENT else -(-end // ALIGNMENT) * ALIGNMENT
        layout.append((offset, length, new))
        end = new + length
    moves = {(data.name, old): new for old, _, new in layout}
    if all(old == new for old, _, new in layout):
        if data.stat().st_size > end:
            os.truncate(data, end)
        return moves
    tmp = data.with_name(data.name + ".tmp")
    with open(data, "rb") as src, open(tmp, "wb") as dst:
        for old, length, new in layout:
            dst.seek(new)
            src.seek(old)
            left = length
            while left:
                chunk = src.read(min(left, 64 << 20))
                if not chunk:
                    raise OSError(f"{data} ends before {old}+{length}")
                dst.write(chunk)
                left -= len(chunk)
    tmp.replace(data)
    return moves
