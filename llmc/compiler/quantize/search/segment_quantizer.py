"""A float graph's segment with an assignment's modules quantized, as a scoring runs it: the
precomputed Q/DQ forms written in, each format's CPU rewrite, and the engine's int8 kernel
(``engine_int8``) where the engine runs it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import onnx_ir as ir

from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.quantize.matmul_targets import find_targets
from llmc.compiler.quantize.qdq import UniqueNames, drop_dead, write_linear
from llmc.compiler.quantize.search.engine_int8 import to_block_int8
from llmc.compiler.quantize.tensor_spill import drop_pages
from llmc.quant.protocol import QuantizedLinear


def quantize_segment(
    segment: onnx.ModelProto,
    wanted: dict[str, str],
    precomputed: dict[tuple[str, str], QuantizedLinear],
    data_dir: Path | None,
    block_int8: bool = False,
) -> onnx.ModelProto:
    """``segment`` with each target module in ``wanted`` ({module: format name, or
    ``"<anchor>:<format name>"`` for an anchor's weights}) replaced by its
    ``precomputed`` Q/DQ form and the formats' CPU rewrites applied, then with ``block_int8``
    its 8-bit weight-only MatMuls on llmc's kernel (``engine_int8.to_block_int8``);
    ``segment`` itself when it has none. External data stays referenced (resolved in
    ``data_dir``). Spilled weights (memory maps) give their pages back once copied into the
    segment."""
    model = ir.from_proto(segment)
    if data_dir is not None:
        ir.external_data.set_base_dir(model.graph, data_dir)
    names = UniqueNames(model.graph)
    used: Counter = Counter()
    written: list[QuantizedLinear] = []
    for target in find_targets(model):
        fmt = wanted.get(target.module)
        if fmt is None:
            continue
        written.append(precomputed[(target.module, fmt)])
        write_linear(model.graph, target, written[-1], names)
        used[fmt] += 1
    if not used:
        return segment
    if block_int8:
        to_block_int8(model)
    drop_dead(model.graph)
    proto = ir.to_proto(model)  # a copy of the weights: spilled ones need no pages any more
    for value in model.graph.initializers.values():  # the ir graph is a reference cycle: its
        value.const_value = None  # arrays (the kernel's weight layouts) go now, not at a GC
    for ql in written:
        drop_pages(ql.weight.data)
        drop_pages(ql.smoothing)
    for fmt in used:  # an anchor's key is "<anchor>:<format>"
        FORMATS[fmt.rpartition(":")[2]].rewrite_for_cpu(proto)
    return proto
