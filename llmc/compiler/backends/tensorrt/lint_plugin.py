"""TensorRT lint of plugin nodes (see ``lint.py``).

TensorRT's ONNX parser imports a node it has no importer for as a plugin, looked up in the plugin
registry by op type, ``plugin_version`` and ``plugin_namespace`` attributes (DESIGN §3); every
other attribute reaches the plugin creator as a field. So each ``llmc::PagedAttention`` node must
carry all of ``REQUIRED_ATTRIBUTES`` with their schema types, this llmc's namespace and
version, consistent head counts, its nine inputs, and q/k/v/cache types the plugin reads.
"""

from __future__ import annotations

import onnx
from onnx import helper

from llmc.compiler.backends.tensorrt.lint_view import node_finding
from llmc.compiler.quantize.microscaling_graph import TRT_DOMAIN
from llmc.engine.kv_cache import KV_CACHE_DTYPES
from llmc.engine.plugin import (
    DOMAIN,
    INPUTS,
    OP_TYPE,
    OPTIONAL_ATTRIBUTES,
    PLUGIN_VERSION,
    REQUIRED_ATTRIBUTES,
)

_ATTR_TYPES = {
    "plugin_namespace": onnx.AttributeProto.STRING,
    "plugin_version": onnx.AttributeProto.STRING,
    "scale": onnx.AttributeProto.FLOAT,
    "logit_softcap": onnx.AttributeProto.FLOAT,
    "kv_cache_dtype": onnx.AttributeProto.STRING,
    "k_scale": onnx.AttributeProto.FLOAT,
    "v_scale": onnx.AttributeProto.FLOAT,
}
_CACHE_TYPES = {"fp8": "FP8", "int8": "INT8"}


def check_plugins(view) -> list:
    """Findings for every custom-domain node of ``view`` (a ``lint.GraphView``) but TensorRT's
    own ``trt`` ops, which its parser imports natively (``lint_microscaling``)."""
    out = []
    for n in view.model.graph.node:
        if n.domain in ("", "ai.onnx", TRT_DOMAIN):
            continue
        err = node_finding(n)
        if n.domain != DOMAIN or n.op_type != OP_TYPE:
            out.append(err("plugin", "no TensorRT plugin is registered for this custom op"))
            continue
        out += _check_node(view, n, err, node_finding(n, "warning"))
    return out


def _check_node(view, n: onnx.NodeProto, err, warn) -> list:
    out = []
    attrs = {a.name: a for a in n.attribute}
    missing = [a for a in REQUIRED_ATTRIBUTES if a not in attrs]
    if missing:
        out.append(err("plugin", f"missing attribute(s) {', '.join(missing)}"))
    for name, a in attrs.items():
        wanted = _ATTR_TYPES.get(name, onnx.AttributeProto.INT)
        if a.type != wanted:
            out.append(
                err(
                    "plugin",
                    f"attribute {name} is {onnx.AttributeProto.AttributeType.Name(a.type)}"
                    f", expected {onnx.AttributeProto.AttributeType.Name(wanted)}",
                )
            )
    values = {k: helper.get_attribute_value(a) for k, a in attrs.items()}
    values = {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}
    expect = {"plugin_namespace": DOMAIN, "plugin_version": PLUGIN_VERSION}
    for name, wanted in expect.items():
        if name in values and values[name] != wanted:
            out.append(err("plugin", f"{name}={values[name]!r}, this llmc registers {wanted!r}"))
    kv = values.get("kv_cache_dtype", OPTIONAL_ATTRIBUTES["kv_cache_dtype"])
    if kv not in KV_CACHE_DTYPES:
        out.append(err("plugin", f"kv_cache_dtype={kv!r} is not one of {KV_CACHE_DTYPES}"))
    heads, kv_heads = values.get("num_heads"), values.get("num_kv_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int):
        if kv_heads < 1 or heads % kv_heads:
            out.append(
                err("plugin", f"num_heads={heads} is not a multiple of num_kv_heads={kv_heads}")
            )
    if len(n.input) != len(INPUTS) or not all(n.input):
        out.append(
            err(
                "plugin",
                f"has {sum(bool(i) for i in n.input)} inputs, expected "
                f"{len(INPUTS)} ({', '.join(INPUTS)})",
            )
        )
        return out
    qkv = {view.type_name(i) for i in n.input[:3]}
    if None in qkv:
        return out  # types unknown: type inference failed, reported under "types"
    if len(qkv) != 1 or not qkv <= {"FP32", "FP16", "BF16"}:
        out.append(
            err("plugin", f"q/k/v types {sorted(map(str, qkv))}: expected one of FP32, FP16, BF16")
        )
    wanted_cache = _CACHE_TYPES.get(kv, next(iter(qkv)) if len(qkv) == 1 else None)
    for name in n.input[3:5]:
        got = view.type_name(name)
        if got is not None and wanted_cache is not None and got != wanted_cache:
            out.append(
                err("plugin", f"cache {name!r} is {got}; kv_cache_dtype {kv} needs {wanted_cache}")
            )
        if got in ("FP8", "INT8"):
            out.append(
                warn(
                    "plugin",
                    f"cache {name!r} is a network input of type {got}: TensorRT documents "
                    "INT8/FP8 as types reached through Q/DQ; a quantized-type input owned by a "
                    "plugin is unverified",
                )
            )
    return out
