"""Calibration text sampled through llmc's runtime from the float graph of a streamed build."""

from __future__ import annotations

import onnx
import pytest
from transformers import AutoTokenizer

from llmc.calibration.data import TextSampler
from llmc.calibration.text_cache import CachedTextSampler
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


class Counting(TextSampler):
    """A sampler that counts the texts it is asked for (around the real one)."""

    def __init__(self, inner: TextSampler) -> None:
        self.inner, self.asked = inner, 0
        self.prefix_stable = inner.prefix_stable

    def sample(self, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
        self.asked += num_texts
        return self.inner.sample(num_texts, max_new_tokens, seed)


def test_cached_texts_are_the_samplers_and_are_sampled_once(sampler, tmp_path):
    """The cache gives the sampler's own texts; a build asks once (a smaller request after a
    larger one is its prefix), and a later build with the same checkpoint asks nothing."""
    counting = Counting(sampler)
    cached = CachedTextSampler(counting, "digest-a", tmp_path)
    six = cached.sample(6, 12, seed=3)
    assert six == sampler.sample(6, 12, seed=3)
    assert cached.sample(2, 12, seed=3) == six[:2] and counting.asked == 6
    later = CachedTextSampler(Counting(sampler), "digest-a", tmp_path)
    assert later.sample(6, 12, seed=3) == six and later.inner.asked == 0
    other = CachedTextSampler(Counting(sampler), "digest-b", tmp_path)  # another checkpoint
    assert other.sample(2, 12, seed=3) == six[:2] and other.inner.asked == 2
    for f in tmp_path.glob("*.json"):  # a damaged file is sampled anew
        f.write_text("{not json")
    again = CachedTextSampler(Counting(sampler), "digest-a", tmp_path)
    assert again.sample(6, 12, seed=3) == six and again.inner.asked == 6
    assert CachedTextSampler(sampler, "digest-a", None).kind == "EngineTextSampler"


def test_the_sampler_engine_runs_this_hosts_8_bit_kernel(sampler):
    """Where the host runs ``llmc::BlockInt8MatMul``, the sampler's 8-bit MatMuls are on it."""
    from llmc.engine.isa import detect_host_isa
    from llmc.plugins.int8_matmul import block_int8_matmul_isa

    graph = onnx.load(str(sampler.engine_dir() / "engine.onnx"), load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    on_kernel = block_int8_matmul_isa(detect_host_isa().features) is not None
    assert (ops.count("BlockInt8MatMul") >= 7) == on_kernel, sorted(set(ops))
    assert ("MatMulNBits" in ops) != on_kernel
