"""KServe v2 gRPC tensors (``ModelInferRequest`` inputs, ``ModelInferResponse`` outputs) to and
from Python values, with tritonclient's codec (``tritonclient.utils``): BYTES elements are
4-byte little-endian lengths then the bytes; numbers are little-endian arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor, triton_to_np_dtype

#: ``InferTensorContents`` field of each datatype (clients that send ``contents`` rather than
#: ``raw_input_contents``, such as KServe's).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class TensorError(ValueError):
    """An input tensor that cannot be read (an unknown datatype, a size that does not match)."""


def input_values(request: service_pb2.ModelInferRequest) -> dict[str, Any]:
    """Each input tensor's first element, by name (the generate tensors are all ``[1]``):
    ``str`` for BYTES (UTF-8), ``bool``, ``int`` or ``float`` otherwise.

    Raises:
        TensorError: a datatype the protocol does not define for these contents, raw contents
            that do not hold one element, or BYTES that are not UTF-8.
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise TensorError(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; give one each"
        )
    values = {}
    for i, tensor in enumerate(request.inputs):
        elements = _raw_elements(tensor, raw[i]) if raw else _contents(tensor)
        if len(elements) == 0:
            raise TensorError(f"input {tensor.name!r} holds no element")
        values[tensor.name] = _python(tensor.name, elements[0])
    return values


def text_output(
    text: str, name: str = "text_output"
) -> tuple[service_pb2.ModelInferResponse.InferOutputTensor, bytes]:
    """One BYTES output tensor of shape ``[1]`` holding ``text`` (an ``InferOutputTensor``) and
    its raw contents."""
    tensor = service_pb2.ModelInferResponse.InferOutputTensor(
        name=name, datatype="BYTES", shape=[1]
    )
    raw = serialize_byte_tensor(np.array([text.encode()], dtype=np.object_))
    return tensor, raw.item()  # the codec returns the buffer as a 0-d object array


def _raw_elements(tensor: Any, raw: bytes) -> Any:
    if tensor.datatype == "BYTES":
        try:
            return deserialize_bytes_tensor(raw)
        except Exception as exc:  # tritonclient raises what struct/numpy raise
            raise TensorError(f"input {tensor.name!r}: malformed BYTES contents ({exc})") from exc
    dtype = triton_to_np_dtype(tensor.datatype)
    if dtype is None or tensor.datatype not in _CONTENTS_FIELD:
        raise TensorError(f"input {tensor.name!r}: unsupported datatype {tensor.datatype!r}")
    if len(raw) % np.dtype(dtype).itemsize:
        raise TensorError(f"input {tensor.name!r}: {len(raw)} bytes are not {tensor.datatype}s")
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))


def _contents(tensor: Any) -> Any:
    field = _CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise TensorError(f"input {tensor.name!r}: unsupported datatype {tensor.datatype!r}")
    return list(getattr(tensor.contents, field))


def _python(name: str, element: Any) -> Any:
    if isinstance(element, bytes):
        try:
            return element.decode()
        except UnicodeDecodeError as exc:
            raise TensorError(f"input {name!r} is not UTF-8 text") from exc
    return element.item() if isinstance(element, np.generic) else element
