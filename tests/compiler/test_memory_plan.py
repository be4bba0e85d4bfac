"""The memory plan's working-set terms against what a build really holds: the Gram matrices
GPTQ collects per layer (q/k/v and gate/up share one input once the graph passes fuse them)
and the widest weight GPTQ factors."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx_ir as ir
import pytest

from llmc.calibration.collect import collect_by_segment
from llmc.compiler.frontend.model_source import load_model, resolve_model
from llmc.compiler.memory.engine_size import CheckpointShapes
from llmc.compiler.quantize.qdq import QuantSpec, calibration_tensors, gptq_keys
from llmc.compiler.stages.export import float_graph
from llmc.runtime.runners.layerwise_runner import LayerwiseRunner
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

BLOCK = 16


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_gram_bytes_and_widest_weight_are_those_calibration_collects(family, tmp_path):
    make = make_tiny_llama if family == "llama" else make_tiny_gemma3
    ckpt = make(tmp_path / "ckpt")
    src = resolve_model(str(ckpt))
    proto, _ = float_graph(load_model(src, "float32"), BLOCK)
    graph = ir.from_proto(proto)
    spec = QuantSpec(quant="int4", weight_rounding="gptq")
    tensors = calibration_tensors(graph, spec)
    grams = gptq_keys(graph, spec)
    runner = LayerwiseRunner(proto, extra_outputs=tuple(dict.fromkeys(tensors.values())))
    windows = [np.arange(3, 35)]
    collected: dict[int, int] = {}
    widest = 0
    for _, stats in collect_by_segment(runner, tensors, windows, gram_keys=grams):
        for key, s in stats.items():
            layer = re.search(r"layers\.(\d+)\.", key)
            if s.gram is not None and layer:
                collected[int(layer[1])] = collected.get(int(layer[1]), 0) + s.gram.nbytes
                widest = max(widest, s.gram.shape[0])

    shapes = CheckpointShapes.of(src)
    assert collected and shapes.largest_gram_bytes() == max(collected.values())
    config = json.loads((ckpt / "config.json").read_text())
    assert shapes.largest_in_features() == widest == config["intermediate_size"]  # down_proj
