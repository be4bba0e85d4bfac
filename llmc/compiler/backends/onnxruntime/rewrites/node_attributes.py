"""Reading an ONNX node's attributes by name, for the lowering's graph rewrites."""

from __future__ import annotations

import onnx
from onnx import helper


def attributes(node: onnx.NodeProto) -> dict:
    """Every attribute of ``node``, name -> Python value (``helper.get_attribute_value``)."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def attribute(node: onnx.NodeProto, name: str, default):
    """The value of ``node``'s attribute ``name``, or ``default`` if it has none."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
