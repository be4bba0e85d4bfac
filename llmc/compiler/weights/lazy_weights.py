"""The initializer values a TensorRT lowering changes, held in the graph or computed when written.

The lowering (``lower.py``) rewrites graph structure on an ``onnx.ModelProto``, and a few of its
steps change weights: float32 initializers cast to the compute dtype, rotary tables copied to
stay float32. It asks a ``Weights`` store to do that:

- ``EAGER`` (``ProtoWeights``): the proto holds the values (the in-memory build) and they are
  changed in place at once;
- ``LazyWeights``: a streamed build's graph, detached from its values (``detach``): its proto
  holds stand-ins (name, type, shape) and each changed value is an ``onnx_ir.LazyTensor`` over
  its source tensor, computed when ``onnx_ir.save`` writes it, one tensor at a time
  (``attach``). Sources are external tensors of the build's work directory, read by
  ``read_array``, which the formats' lazy weight rewrites (``int8_weights``) use too.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

#: External-data location of a detached initializer's stand-in: never read (``attach``
#: replaces every one), and not a file name a real graph uses.
STAND_IN = "<llmc: values held by LazyWeights>"


class Weights(Protocol):
    """How a lowering changes initializer values (see the module docstring)."""

    def cast(self, t: onnx.TensorProto, elem_type: int, dtype: type) -> None:
        """``t``'s values become numpy ``dtype`` (ONNX ``elem_type``); the shape stays."""
        ...

    def copy(self, t: onnx.TensorProto, name: str) -> onnx.TensorProto:
        """A new initializer ``name`` with ``t``'s values (the caller adds it to a graph)."""
        ...


class ProtoWeights:
    """``Weights`` whose values are in the proto: changed at once (the in-memory build)."""

    def cast(self, t: onnx.TensorProto, elem_type: int, dtype: type) -> None:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype), t.name))

    def copy(self, t: onnx.TensorProto, name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(numpy_helper.to_array(t), name)


EAGER = ProtoWeights()


class LazyWeights:
    """``Weights`` of a detached graph: ``values`` maps each initializer's name to its tensor,
    the source (an ``onnx_ir`` tensor, usually external) or a ``LazyTensor`` computing the
    changed value from it when written. The proto's tensors are stand-ins (``STAND_IN``)."""

    def __init__(self, values: dict[str, ir.TensorProtocol]):
        self.values = values

    def cast(self, t: onnx.TensorProto, elem_type: int, dtype: type) -> None:
        name, target = t.name, ir.DataType(elem_type)
        src = self.values[name]

        def read() -> ir.TensorProtocol:
            return ir.tensor(read_array(src).astype(dtype), dtype=target, name=name)

        self.values[name] = ir.LazyTensor(read, dtype=target, shape=src.shape, name=name)
        t.data_type = elem_type

    def copy(self, t: onnx.TensorProto, name: str) -> onnx.TensorProto:
        src = self.values[t.name]

        def read() -> ir.TensorProtocol:
            return ir.tensor(read_array(src), dtype=src.dtype, name=name)

        self.values[name] = ir.LazyTensor(read, dtype=src.dtype, shape=src.shape, name=name)
        new = onnx.TensorProto()
        new.CopyFrom(t)
        new.name = name
        return new

    def attach(self, proto: onnx.ModelProto) -> ir.Model:
        """``proto`` (a detached graph, lowered) with its initializers' values: an
        ``onnx_ir`` model whose changed tensors are computed when saved. Raises ValueError for
        an initializer this store has no values for (added without ``copy``)."""
        model = ir.from_proto(proto)
        described = {vi.name for vi in proto.graph.value_info}
        for name, value in model.graph.initializers.items():
            if name not in self.values:
                raise ValueError(f"initializer {name!r} was added to the graph without values")
            value.const_value = self.values[name]
            if name not in described:  # else saving adds a value_info the proto did not have
                value.type = value.shape = None
        return model


def detach(model: ir.Model) -> tuple[onnx.ModelProto, LazyWeights]:
    """``model`` as a proto without weight values, and the store holding them: every
    initializer of the proto is a stand-in with its name, type and shape, and nothing is read.
    ``model`` is left as it was."""
    inits = [v for v in model.graph.initializers.values() if v.const_value is not None]
    values = {v.name: v.const_value for v in inits}
    try:
        for v in inits:
            t = v.const_value
            v.const_value = ir.ExternalTensor(
                STAND_IN, 0, t.nbytes, t.dtype, shape=t.shape, name=v.name
            )
        proto = ir.to_proto(model)
    finally:
        for v in inits:
            v.const_value = values[v.name]
    return proto, LazyWeights(values)


def read_array(t: ir.TensorProtocol) -> np.ndarray:
    """``t``'s values in memory of their own. An external tensor of 8-bit or wider elements is
    read from its file rather than memory-mapped, so no mapping (and no resident page of the
    file) outlives the read."""
    if isinstance(t, ir.ExternalTensor) and t.dtype.bitwidth >= 8:
        count = t.size
        array = np.fromfile(t.path, dtype=t.dtype.numpy(), count=count, offset=t.offset or 0)
        if array.size != count:
            raise ValueError(f"{t.path} is shorter than tensor {t.name!r} says")
        return array.reshape(t.shape.numpy())
    return np.array(t.numpy())
