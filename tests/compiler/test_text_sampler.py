"""Calibration text sampled through llmc's runtime from the float graph of a streamed build."""

from __future__ import annotations

import onnx
import pytest
from transformers import AutoTokenizer

from llmc.compiler.backends.onnxruntime.text_sampler import EngineTextSampler
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.plan import plan_memory
from llmc.compiler.stages.export import export
from llmc.compiler.stages.load import load, resolve


@pytest.fixture(scope="module")
def sampler(tiny_llama_dir, tmp_path_factory):
    """An ``EngineTextSampler`` over the streamed float graph of the tiny Llama."""
    config = BuildConfig.of(model=str(tiny_llama_dir), block_size=4)
    resolved = resolve(config.source)
    memory = plan_memory(resolved.source, "none", cpu=True, limit_gb=None)
    model = load(resolved, memory=memory)
    work = tmp_path_factory.mktemp("work")
    graph = export(model, config.export, work_dir=work, in_flight_bytes=memory.in_flight_bytes)
    assert graph.weights_dir == work and isinstance(graph.proto, onnx.ModelProto)
    return EngineTextSampler(graph.proto, graph.weights_dir, model.tokenizer, 4, 2, work)


def test_a_seed_gives_the_same_texts_at_any_batch_size(sampler):
    four = sampler.sample(4, 12, seed=7)  # 4 sequences share the steps
    two = sampler.sample(2, 12, seed=7)
    assert four[:2] == two and len(set(four)) == 4
    assert sampler.sample(2, 12, seed=8) != two


def test_texts_have_their_full_length(sampler, tiny_llama_dir):
    """EOS is masked until each text has max_new_tokens tokens (``min_tokens``)."""
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    for text in sampler.sample(16, 32, seed=0):  # re-tokenizing stray bytes may give more
        assert len(tok(text, add_special_tokens=False).input_ids) >= 28
