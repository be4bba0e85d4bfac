"""The HF module a node of an exported graph came from (``model.layers.0.mlp.down_proj``).

torch.onnx's dynamo exporter records each node's module scopes in the node's metadata
(``pkg.torch.onnx.name_scopes``); llmc wraps the HF model as ``PackedCausalLM.model``, so the
leading ``model.`` is dropped and the names are the checkpoint's own (``lm_head``,
``model.layers.3.self_attn.o_proj``), the names ``--exclude`` patterns match.
"""

from __future__ import annotations

import ast

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_WRAPPER_PREFIX = "model."


def module_name_from_scopes(scopes: str | None) -> str | None:
    """The innermost module path in an exporter ``name_scopes`` string, or None if absent."""
    if not scopes:
        return None
    try:
        items = ast.literal_eval(scopes)
    except (ValueError, SyntaxError):
        return None
    paths = [s for s in items if isinstance(s, str) and s.startswith(_WRAPPER_PREFIX)]
    if not paths:
        return None
    return max(paths, key=len)[len(_WRAPPER_PREFIX) :]


def fused_module_name(names: list[str]) -> str:
    """One name for modules fused into one node: ``a.b.q_proj+k_proj+v_proj``."""
    parts = [n.rsplit(".", 1) for n in names]
    parents = {p[0] for p in parts if len(p) == 2}
    if len(parents) == 1 and all(len(p) == 2 for p in parts):
        return f"{parents.pop()}." + "+".join(p[1] for p in parts)
    return "+".join(names)
