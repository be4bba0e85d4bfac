"""``llmc::PagedAttention`` as a TensorRT ``IPluginV3`` with an ``IPluginCreatorV3One`` creator.

The interface both TensorRT 11 and TensorRT for RTX accept: TensorRT-RTX refuses
quickly-deployable (``tensorrt.plugin``) creators at parse ("TensorRT-RTX imports IPluginV3
plugins registered with an IPluginCreatorV3One creator only"). The classes are made for the
TensorRT module at hand (``tensorrt`` or ``tensorrt_rtx_bindings``, the same Python API), so one
definition serves both: :func:`register` takes the module.

The contract is ``llmc.engine.plugin`` (inputs, attributes) and ``trt_plugin`` (outputs,
aliasing, dtypes: :func:`trt_plugin.describe_outputs`): outputs 1 and 2 alias inputs 3 and 4
(``IPluginV3OneBuildV2.get_aliased_input``; in effect with
``PreviewFeature.ALIASED_PLUGIN_IO_10_03``). Attributes arrive as plugin fields (onnx-tensorrt
``loadFields``: only the fields the creator declares; a string with a NUL appended).

``enqueue`` runs the Triton launcher (``triton_launch.paged_attention_triton``: the kernel
variant chosen per step shape) on TensorRT's stream, on zero-copy torch views of TensorRT's
buffers. Tested here: the build half (parse, formats, shapes, aliasing, serialization) with
TensorRT-RTX's real builder on a CPU host. ``enqueue`` NEVER RAN: it needs a GPU TensorRT-RTX
targets (sm86, sm89, sm120), which no machine of ours has.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from llmc.engine.plugin import DOMAIN, INPUTS, OP_TYPE, PLUGIN_VERSION, PluginAttributes
from llmc.plugins.paged_attention.trt_plugin import ALIASED_INPUTS, OUTPUTS

#: Positions in TensorRT's (inputs, outputs) list, by name.
_INPUT = {name: i for i, name in enumerate(INPUTS)}
_Q, _KEY_CACHE, _VALUE_CACHE = _INPUT["q"], _INPUT["key_cache"], _INPUT["value_cache"]
_CACHE_POSITIONS = frozenset(
    (_KEY_CACHE, _VALUE_CACHE, *(len(INPUTS) + OUTPUTS.index(n) for n in OUTPUTS[1:]))
)
#: The metadata inputs' one type each.
_INT_INPUTS = {
    _INPUT["seq_lens"]: "INT32",
    _INPUT["query_start_loc"]: "INT32",
    _INPUT["block_tables"]: "INT32",
    _INPUT["slot_mapping"]: "INT64",
}
_ACTIVATIONS = ("FLOAT", "HALF", "BF16")
_CACHE_TYPES = {"fp8": "FP8", "int8": "INT8"}


def field_values(collection) -> dict[str, object]:
    """{name: value} of a ``PluginFieldCollection`` as the parser or a serialized plan hands
    it: INT32 and FLOAT32 fields as Python numbers, CHAR fields as strings (NULs stripped)."""
    values: dict[str, object] = {}
    for f in collection:
        data = np.asarray(f.data)
        if (data.dtype.kind in "iu" and data.dtype.itemsize == 1) or data.dtype.kind == "S":
            values[f.name] = bytes(data.tobytes()).decode().rstrip("\x00")
        elif data.dtype.kind == "f":
            values[f.name] = float(data.reshape(-1)[0])
        else:
            values[f.name] = int(data.reshape(-1)[0])
    return values


def attributes_from_fields(collection) -> PluginAttributes:
    """The node's ``PluginAttributes`` from its plugin fields (absent optional ones defaulted).
    Raises LlmcError or TypeError for fields the contract does not have or a missing one."""
    known = {f.name for f in fields(PluginAttributes)}
    values = {k: v for k, v in field_values(collection).items() if k in known}
    types = {f.name: f.type for f in fields(PluginAttributes)}
    converted = {
        k: {"int": int, "float": float, "str": str}[types[k]](v) for k, v in values.items()
    }
    attributes = PluginAttributes(**converted)
    attributes.check()
    return attributes


def plugin_fields(trt, attributes: PluginAttributes | None):
    """(a ``PluginFieldCollection`` of the attributes, the arrays its fields point into):
    empty values for the creator's list. A ``PluginField`` holds a pointer into its array, not
    the array: the caller keeps the arrays alive as long as TensorRT may read the fields."""
    kinds = {"int": (np.int32, "INT32"), "float": (np.float32, "FLOAT32"), "str": (None, "CHAR")}
    out, arrays = [], []
    for f in fields(PluginAttributes):
        dtype, kind = kinds[f.type]
        if attributes is None:
            data = np.array([], dtype=dtype or np.int8)
        elif dtype is None:
            data = np.frombuffer(getattr(attributes, f.name).encode() + b"\x00", dtype=np.int8)
        else:
            data = np.array([getattr(attributes, f.name)], dtype=dtype)
        arrays.append(data)
        out.append(trt.PluginField(f.name, data, getattr(trt.PluginFieldType, kind)))
    return trt.PluginFieldCollection(out), arrays


def expected_type(trt, pos: int, q_type, attributes: PluginAttributes):
    """The one ``trt.DataType`` position ``pos`` of (inputs, outputs) may have once q's type
    is ``q_type``: q, k, v and ``output`` q's; the caches q's or the quantized cache's;
    metadata int32, the slot mapping int64."""
    dt = trt.DataType
    if pos in _INT_INPUTS:
        return getattr(dt, _INT_INPUTS[pos])
    if pos in _CACHE_POSITIONS and attributes.kv_cache_dtype in _CACHE_TYPES:
        return getattr(dt, _CACHE_TYPES[attributes.kv_cache_dtype])
    return q_type


def plugin_classes(trt):
    """(plugin class, creator class) for the TensorRT module ``trt``."""

    class PagedAttentionPlugin(
        trt.IPluginV3,
        trt.IPluginV3OneCore,
        trt.IPluginV3OneBuildV2,
        trt.IPluginV3OneRuntime,
    ):
        """One PagedAttention node: build-time shapes, types and aliasing; ``enqueue``."""

        def __init__(self, attributes: PluginAttributes):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuildV2.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.attributes = attributes
            self.num_outputs = len(OUTPUTS)
            self.plugin_namespace = DOMAIN
            self.plugin_name = OP_TYPE
            self.plugin_version = PLUGIN_VERSION
            self.timing_cache_id = ""

        def get_capability_interface(self, kind):
            return self

        def clone(self):
            return PagedAttentionPlugin(self.attributes)

        def get_fields_to_serialize(self):
            collection, self._field_arrays = plugin_fields(trt, self.attributes)
            return collection

        def get_output_data_types(self, input_types):
            return [input_types[_Q], input_types[_KEY_CACHE], input_types[_VALUE_CACHE]]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [trt.DimsExprs(inputs[i]) for i in (_Q, _KEY_CACHE, _VALUE_CACHE)]

        def get_aliased_input(self, output_index):
            return ALIASED_INPUTS.get(output_index, -1)

        def supports_format_combination(self, pos, in_out, num_inputs):
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            if pos == _Q:
                return desc.type in [getattr(trt.DataType, n) for n in _ACTIVATIONS]
            return desc.type == expected_type(trt, pos, in_out[_Q].desc.type, self.attributes)

        def configure_plugin(self, inputs, outputs):
            pass

        def on_shape_change(self, inputs, outputs):
            pass

        def get_valid_tactics(self):
            return []

        def set_tactic(self, tactic):
            pass

        def attach_to_context(self, context):
            return self.clone()

        def get_workspace_size(self, inputs, outputs):
            return 0

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            _enqueue(trt, self.attributes, input_desc, output_desc, inputs, outputs, stream)

    class PagedAttentionCreator(trt.IPluginCreatorV3One):
        """Makes ``PagedAttentionPlugin``s from a node's fields (parse) or a plan's (load)."""

        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name = OP_TYPE
            self.plugin_namespace = DOMAIN
            self.plugin_version = PLUGIN_VERSION
            self.field_names, self._field_arrays = plugin_fields(trt, None)

        def create_plugin(self, name, field_collection, phase):
            return PagedAttentionPlugin(attributes_from_fields(field_collection))

    return PagedAttentionPlugin, PagedAttentionCreator


def register(trt) -> object:
    """Register the ``llmc::PagedAttention`` creator with ``trt``'s plugin registry (namespace
    ``llmc``) and return it; keep it alive as long as the registry may call it. Call before
    parsing a graph with PagedAttention nodes or deserializing a plan that holds them."""
    _, creator_class = plugin_classes(trt)
    creator = creator_class()
    if not trt.get_plugin_registry().register_creator(creator, DOMAIN):
        raise RuntimeError(f"TensorRT refused to register the {DOMAIN}::{OP_TYPE} creator")
    return creator


def _enqueue(trt, attributes, input_desc, output_desc, inputs, outputs, stream) -> None:
    """The Triton launcher on TensorRT's ``stream`` over TensorRT's device buffers."""
    import torch

    from llmc.plugins.paged_attention.triton_launch import paged_attention_triton
    from llmc.plugins.paged_attention.trt_register import cuda_array_interface

    dtypes = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.BF16: torch.bfloat16,
        trt.DataType.FP8: torch.float8_e4m3fn,
        trt.DataType.INT8: torch.int8,
        trt.DataType.INT32: torch.int32,
        trt.DataType.INT64: torch.int64,
    }

    def view(desc, pointer) -> torch.Tensor:
        dtype = dtypes[desc.type]
        shape = tuple(int(d) for d in desc.dims)
        strides = [1] * len(shape)
        for axis in range(len(shape) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * shape[axis + 1]
        itemsize = torch.empty((), dtype=dtype).element_size()
        buffer = _Buffer(cuda_array_interface(pointer, shape, strides, itemsize))
        return torch.as_tensor(buffer, device="cuda").view(dtype)

    ins = [view(d, p) for d, p in zip(input_desc, inputs, strict=True)]
    outs = [view(d, p) for d, p in zip(output_desc, outputs, strict=True)]
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        paged_attention_triton(
            *ins[:3], outs[1], outs[2], *ins[5:], **attributes.kernel_arguments(), out=outs[0]
        )


class _Buffer:  # holds a __cuda_array_interface__ for torch.as_tensor
    def __init__(self, interface: dict):
        self.__cuda_array_interface__ = interface
