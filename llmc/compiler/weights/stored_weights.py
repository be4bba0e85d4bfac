"""A float32 graph whose weights are stored in the checkpoint's 16-bit float type.

A bfloat16 checkpoint's weights carry 16 bits of information each; the float graph of a streamed
build (``streamed_export``) computes in float32, and written at float32 it would take twice the
checkpoint's disk (14.4 GB for a 3B model, 282 GB for a 70B one) for nothing. So each such
weight ``W`` is written as ``W::stored`` in the checkpoint's type, with a ``Cast`` to float32 in
front of each node that reads it. The graph computes what the float32 graph computes (widening
bfloat16 or float16 to float32 is exact). ONNX Runtime folds the casts when it loads a segment
(``ORT_ENABLE_BASIC`` and above), so calibration and the accuracy report run it as it is and the
cpu lowering writes float32 weights; ``fold_stored_weights`` turns the casts back into float32
initializers (widened when read) for the passes that read weights (quantization, the TensorRT
lowering), which then see the graph the float32 export gives, names included.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from llmc.compiler.passes.weight_transpose import TRANSPOSED_SOURCE
from llmc.compiler.weights.checkpoint_weights import (
    CHECKPOINT_SOURCE,
    TensorLocation,
    external_tensor,
)
from llmc.compiler.weights.shared_weights import ALIGNMENT

#: Name suffix of a stored (narrow) initializer; the float32 value it stands for drops it.
STORED_SUFFIX = "::stored"

#: Checkpoint types a float32 weight can be stored in exactly.
STORABLE = (ir.DataType.BFLOAT16, ir.DataType.FLOAT16)

#: Initializers below this size stay float32 (they are not external data either).
MIN_STORED_BYTES = 4096


def checkpoint_float_dtype(dtypes: Iterable[ir.DataType]) -> ir.DataType | None:
    """The 16-bit float type every float tensor of a checkpoint has (``dtypes``: each tensor's
    element type), or None when they are float32 or mixed (nothing is stored narrow)."""
    floats = {d for d in dtypes if d.is_floating_point()}
    if len(floats) == 1 and next(iter(floats)) in STORABLE:
        return next(iter(floats))
    return None


#: Elements narrowed at a time: the float32 temporaries of a narrowing stay at 64 MB.
_NARROW_CHUNK = 1 << 24


def _narrowed(src: ir.TensorProtocol, dtype: ir.DataType, name: str) -> ir.TensorProtocol:
    """``src`` (float32) in ``dtype``, computed when written. A checkpoint tensor stored in
    ``dtype`` and widened on read (``checkpoint_weights.CHECKPOINT_SOURCE``), or its transpose
    (``weight_transpose.TRANSPOSED_SOURCE``), is written from the checkpoint's own bytes: exact
    by construction, and no float32 value is made (a 3B model's tied 128256 x 3072 table is
    0.8 GB stored, 1.6 GB widened, and narrowing it back whole held 4 GB of temporaries).
    Anything else is narrowed ``_NARROW_CHUNK`` elements at a time. Raises ValueError, naming
    the tensor, when a computed value is not exact in ``dtype`` (a weight not from the
    checkpoint)."""
    stored = _checkpoint_bytes(src, dtype, name)
    if stored is not None:
        return stored

    def read() -> ir.TensorProtocol:
        wide = np.ascontiguousarray(src.numpy(), dtype=np.float32).reshape(-1)
        narrow = np.empty(wide.shape, dtype.numpy())
        for start in range(0, wide.size, _NARROW_CHUNK):
            part = wide[start : start + _NARROW_CHUNK]
            if dtype == ir.DataType.BFLOAT16:  # the high half of each float32: exact iff low is 0
                bits = part.view(np.uint32)
                exact = not (bits & 0xFFFF).any()
                narrow[start : start + _NARROW_CHUNK] = (
                    (bits >> 16).astype(np.uint16).view(narrow.dtype)
                )
            else:
                narrow[start : start + _NARROW_CHUNK] = part
                exact = np.array_equal(narrow[start : start + part.size].astype(np.float32),
                                       part, equal_nan=True)  # fmt: skip
            if not exact:
                raise ValueError(f"{name}: values are not exact in {dtype.name}")
        return ir.tensor(narrow.reshape(tuple(src.shape)), dtype=dtype, name=name)

    return ir.LazyTensor(read, dtype=dtype, shape=src.shape, name=name)


def _checkpoint_bytes(
    src: ir.TensorProtocol, dtype: ir.DataType, name: str
) -> ir.TensorProtocol | None:
    """``src``'s values in ``dtype`` read from the checkpoint bytes they were widened from
    (the bytes themselves, or their transpose made when written), or None when ``src`` is not
    such a tensor."""
    perm = None
    meta = src.meta if isinstance(src, ir.LazyTensor) else {}
    if TRANSPOSED_SOURCE in meta:
        inner, perm = meta[TRANSPOSED_SOURCE]
        meta = inner.meta if isinstance(inner, ir.LazyTensor) else {}
    loc = meta.get(CHECKPOINT_SOURCE)
    if not isinstance(loc, TensorLocation) or loc.dtype != dtype:
        return None
    if perm is None:
        return external_tensor(loc, name) if tuple(loc.shape) == tuple(src.shape) else None

    def read() -> ir.TensorProtocol:
        return ir.tensor(np.ascontiguousarray(np.transpose(loc.read(), perm)), name=name)

    return ir.LazyTensor(read, dtype=dtype, shape=src.shape, name=name)


class WidenedTensor(ir.LazyTensor):
    """A 16-bit stored weight (``stored``) read as float32, widened when read (a copy: nothing
    of the stored bytes is kept). ``stored`` stays readable for readers that widen a slice at a
    time (``llmc.compiler.quantize.weight_columns``)."""

    def __init__(self, stored: ir.TensorProtocol, name: str):
        super().__init__(
            lambda: _read_widened(stored, name),
            dtype=ir.DataType.FLOAT,
            shape=stored.shape,
            name=name,
        )
        self.stored = stored

    def release(self) -> None:
        """Unmap the stored bytes (kept mapped while another reader holds a view of them)."""
        _release(self.stored)


def _read_widened(src: ir.TensorProtocol, name: str) -> ir.TensorProtocol:
    wide = src.numpy().astype(np.float32)  # a copy: nothing of the stored bytes is kept
    # Unmap the stored bytes once read: the lazy tensor is read again when needed, and an
    # ExternalTensor keeps its memory map (and the pages read) until released, so whoever
    # holds this tensor would otherwise hold the weight's pages (a 3B bfloat16 graph:
    # 6.4 GB resident once every weight has been read).
    _release(src)
    return ir.tensor(wide, name=name)


def _release(src: ir.TensorProtocol) -> None:
    release = getattr(src, "release", None)
    if release is not None:
        try:
            release()
        except BufferError:  # another reader holds a view of the mapping: it stays
            pass


def store_weights(model: ir.Model, dtype: ir.DataType, min_bytes: int = MIN_STORED_BYTES) -> int:
    """Store every float32 initializer of ``model``'s main graph of at least ``min_bytes`` in
    ``dtype`` (``STORABLE``), a ``Cast`` to float32 before each node that reads it. Nothing is
    read: the narrow values are computed when the model is saved, and saving raises ValueError
    if a value is not exact in ``dtype``. Returns how many initializers are stored."""
    if dtype not in STORABLE:
        raise ValueError(f"weights are stored in {[d.name for d in STORABLE]}, not {dtype.name}")
    graph = model.graph
    count = 0
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or tensor.dtype != ir.DataType.FLOAT or tensor.nbytes < min_bytes:
            continue
        uses = list(value.uses())
        if not uses or value.is_graph_output() or any(u.node.graph is not graph for u in uses):
            continue
        stored_name = name + STORED_SUFFIX
        stored = ir.Value(name=stored_name, const_value=_narrowed(tensor, dtype, stored_name))
        stored.shape, stored.type = tensor.shape, ir.TensorType(dtype)
        del graph.initializers[name]
        graph.register_initializer(stored)
        for i, use in enumerate(uses):
            cast = ir.node(
                "Cast", [stored], {"to": int(ir.DataType.FLOAT)}, name=f"{name}::cast{i}"
            )
            out = cast.outputs[0]
            out.name = name if i == 0 else f"{name}::use{i}"
            out.shape, out.type = value.shape, value.type
            graph.insert_before(use.node, cast)
            use.node.replace_input_with(use.idx, out)
        count += 1
    return count


def fold_stored_weights(model: ir.Model) -> list[ir.Value]:
    """Undo ``store_weights``: each ``Cast`` of a stored initializer becomes the float32
    initializer it stands for (one per stored weight, named without ``STORED_SUFFIX``, widened
    when read). Returns the new float32 initializers."""
    graph = model.graph
    wide: dict[str, ir.Value] = {}
    for node in list(graph):
        src = node.inputs[0] if node.op_type == "Cast" and node.inputs else None
        if src is None or not src.name or not src.name.endswith(STORED_SUFFIX):
            continue
        if not src.is_initializer() or src.const_value is None:
            continue
        name = src.name.removesuffix(STORED_SUFFIX)
        if name not in wide:
            value = ir.Value(name=name, const_value=WidenedTensor(src.const_value, name))
            value.shape, value.type = src.const_value.shape, ir.TensorType(ir.DataType.FLOAT)
            wide[name] = value
        ir.convenience.replace_all_uses_with(node.outputs[0], wide[name])
        graph.remove(node, safe=True)
        if not src.uses():
            del graph.initializers[src.name]
    for value in wide.values():
        graph.register_initializer(value)
    return list(wide.values())


def widen_segment(segment: onnx.ModelProto, data_dir: Path, file_name: str) -> onnx.ModelProto:
    """``segment`` (a graph whose external data is in ``data_dir``) with its stored weights
    folded (`fold_stored_weights`) and written in float32 to ``data_dir / file_name``, one at a
    time, so that ONNX Runtime gets float32 initializers: it folds a ``Cast`` of an initializer
    itself only below about 1 GB of output (measured: a [100000, 3072] bfloat16 table stays a
    ``Cast`` at ``ORT_ENABLE_ALL``; [60000, 3072] is folded). Returns ``segment`` itself when
    it holds no stored weight (nothing is written)."""
    model = ir.from_proto(segment)
    ir.external_data.set_base_dir(model.graph, data_dir)
    widened = fold_stored_weights(model)
    if not widened:
        return segment
    with open(data_dir / file_name, "wb") as f:
        for value in widened:
            offset = -f.tell() % ALIGNMENT + f.tell()
            f.seek(offset)
            array = np.ascontiguousarray(value.const_value.numpy())
            f.write(memoryview(array).cast("B"))  # the widened values, not a bytes copy of them
            value.const_value = ir.ExternalTensor(
                file_name,
                offset,
                array.nbytes,
                ir.DataType.FLOAT,
                shape=value.const_value.shape,
                name=value.name,
                base_dir=data_dir,
            )
            del array
    return ir.to_proto(model)


def segment_widener(weights_dir: Path | None):
    """``LayerwiseRunner``'s ``prepare`` for a float graph whose 16-bit stored weights are in
    ``weights_dir`` (``stored_weights.widen_segment``), None without one."""
    if weights_dir is None:
        return None
    return lambda segment, name: widen_segment(segment, weights_dir, name)
