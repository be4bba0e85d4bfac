"""Graph passes over the exported ONNX model (DESIGN §5).

The pipeline is one ordered list; each pass rewrites an ``onnx_ir.Model`` in place and returns
how many rewrites it made, and ``run_passes`` returns that report as ``{pass name: count}``.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from llmc.compiler.passes.head_layout import keep_heads_token_major
from llmc.compiler.passes.no_op import remove_no_ops
from llmc.compiler.passes.parallel_matmul import fuse_parallel_matmuls
from llmc.compiler.passes.rms_norm import fuse_rms_norm
from llmc.compiler.passes.rotary_embedding import fuse_rotary_embedding
from llmc.compiler.passes.tied_weights import use_tied_weights
from llmc.compiler.passes.weight_transpose import fold_weight_transposes


def _num_nodes(model: ir.Model) -> int:
    return sum(1 for _ in model.graph)


def _fold_constants(model: ir.Model) -> int:
    """Inline functions, fold constants (small tensors only: the exporter leaves weights alone)."""
    import onnxscript.optimizer as optimizer

    before = _num_nodes(model)
    optimizer.inline(model)
    optimizer.fold_constants(model)
    common_passes.RemoveUnusedNodesPass()(model)
    return before - _num_nodes(model)


def _dedupe(model: ir.Model) -> int:
    before = _num_nodes(model)
    common_passes.CommonSubexpressionEliminationPass()(model)
    common_passes.RemoveUnusedNodesPass()(model)
    return before - _num_nodes(model)


PIPELINE: list[tuple[str, Callable[[ir.Model], int]]] = [
    ("weight_transpose", fold_weight_transposes),
    ("fold_constants", _fold_constants),
    ("no_op_arithmetic", remove_no_ops),
    ("rms_norm", fuse_rms_norm),
    ("rotary_embedding", fuse_rotary_embedding),
    ("head_layout", keep_heads_token_major),
    ("parallel_matmul", fuse_parallel_matmuls),
    ("tied_weights", use_tied_weights),
    ("dead_and_duplicate_nodes", _dedupe),
]


#: Passes a build opts into: ``tied_weights`` reads a tied table through ``Gemm(transB=1)``,
#: which the quantizer does not rewrite, so only unquantized builds run it (a quantized build
#: gives the vocabulary projection its own quantized weights instead).
OPTIONAL = frozenset({"tied_weights"})


def run_passes(model: ir.Model, optional: frozenset[str] = frozenset()) -> dict[str, int]:
    """Apply ``PIPELINE`` to ``model`` in order, the ``OPTIONAL`` passes only when named in
    ``optional``; returns ``{pass name: rewrites made}`` of the passes run."""
    return {name: fn(model) for name, fn in PIPELINE if name not in OPTIONAL or name in optional}
