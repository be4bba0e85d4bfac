"""A GGUF file streams like a safetensors checkpoint. Each tensor of the lazy index
(``gguf_weights``) equals, bit for bit, the float32 weight transformers' whole-file GGUF load
makes of it; a tiny GGUF's streamed engine equals the in-memory path's engine (weights and
logits); and the real Gemma 3 270M file's tensors equal transformers' load.

The tiny GGUF files are written here with the ``gguf`` package's writer, from a random
transformers model, as llama.cpp's converter lays them out (Llama: Q/K rows permuted; Gemma:
norms stored as ``w + 1``), in many ggml types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
and Q4_K (which ``gguf`` cannot quantize: its blocks are written random, scales bounded).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.frontend.gguf_file import check_gguf
from llmc.compiler.frontend.gguf_weights import can_stream_gguf, index_gguf
from llmc.compiler.frontend.model_source import ModelSource, load_model, resolve_model
from llmc.compiler.frontend.streamed_export import can_stream, meta_model
from tests.compiler.test_streaming_build import in_memory_engine, prefill_logits, weight_digests
from tests.tiny_models import train_tokenizer

Q = gguf.GGMLQuantizationType
# GGUF tensor kind (the name's part after the block number) -> the ggml type it is written in.
_TYPES = {
    "token_embd": Q.Q8_0,
    "output": Q.F16,
    "attn_q": Q.Q8_0,
    "attn_k": Q.Q5_0,
    "attn_v": Q.Q4_0,
    "attn_output": Q.BF16,
    "ffn_gate": Q.Q5_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": Q.Q4_K,  # rows of 256: one K-quant super-block
    "attn_norm": Q.F16,  # a Gemma norm's "- 1" runs on the F16 value widened to float32
}
_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=2)


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp ``convert_hf_to_gguf.py`` ``LlamaModel.permute``: Q/K rows from HF's rotary
    halves to interleaved pairs."""
    pairs = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
    return pairs.swapaxes(1, 2).reshape(w.shape)


def _random_q4_k(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Q4_K blocks (256 elements in 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales, 128
    of 4-bit quants) with random quants and scales, d and dmin small: [rows, cols/256*144]."""
    blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
    blocks[:, 0:2] = np.array([0.002], np.float16).view(np.uint8)  # d
    blocks[:, 2:4] = np.array([0.01], np.float16).view(np.uint8)  # dmin
    return blocks.reshape(rows, cols // 256 * 144)


def _stored(kind: str, w: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, Q | None]:
    """``w`` as the writer takes it in ``_TYPES[kind]`` (F32 when not listed): the array, and
    the raw ggml type for one given as bytes."""
    qtype = _TYPES.get(kind, Q.F32)
    if qtype == Q.F32:
        return w.astype(np.float32), None
    if qtype == Q.F16:
        return w.astype(np.float16), None
    if qtype == Q.Q4_K:
        return _random_q4_k(*w.shape, rng), qtype
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def _write_tokenizer(writer: gguf.GGUFWriter, work: Path) -> None:
    """The tiny models' byte-level BPE tokenizer as GGUF ``gpt2`` tokenizer metadata."""
    train_tokenizer(work)
    spec = json.loads((work / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    specials = {t["content"] for t in spec["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])  # CONTROL, NORMAL
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(2)


def write_tiny_gguf(path: Path, family: str, seed: int = 0) -> Path:
    """Write a 2-layer ``family`` ("llama": GQA, untied; "gemma3": MQA, tied, one sliding and
    one global layer) to the GGUF file ``path``, with the tiny models' tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if family == "llama":
        cfg = LlamaConfig(**_TINY, num_attention_heads=4, num_key_value_heads=2)
        model, arch = LlamaForCausalLM(cfg), gguf.MODEL_ARCH.LLAMA
    else:
        cfg = Gemma3TextConfig(
            **_TINY,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        )
        model, arch = Gemma3ForCausalLM(cfg), gguf.MODEL_ARCH.GEMMA3
    name = gguf.MODEL_ARCH_NAMES[arch]
    writer = gguf.GGUFWriter(str(path), name)
    writer.add_name(f"tiny {family}")
    writer.add_context_length(512)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    if family == "llama":
        writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    else:
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_sliding_window(cfg.sliding_window)
    _write_tokenizer(writer, path.parent / f"{path.stem}_tokenizer")
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        w = t.float().numpy()
        if family == "gemma3" and "norm" in hf_name:
            w = rng.normal(0.0, 0.1, w.shape) + 1.0  # stored as w + 1 (random init leaves 0)
        if family == "llama" and ".attn_q." in gguf_name:
            w = _llama_permute(w * 4.0, cfg.num_attention_heads)  # sharper attention
        if family == "llama" and ".attn_k." in gguf_name:
            w = _llama_permute(w * 4.0, cfg.num_key_value_heads)
        kind = gguf_name.split(".")[-2]
        data, raw = _stored(kind, w, rng)
        writer.add_tensor(gguf_name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def source(path: Path) -> ModelSource:
    return resolve_model(str(path))


def assert_index_is_transformers_load(src: ModelSource, loaded=None) -> set[int]:
    """Every tensor of the lazy index equals transformers' float32 load (``loaded``, else
    loaded here) bit for bit, and the index covers every parameter but a tied one. Returns the
    ggml types it read."""
    index = index_gguf(src.directory / src.gguf_file, meta_model(src).model)
    loaded = load_model(src, "float32") if loaded is None else loaded
    state = loaded.state_dict()
    tied = set(getattr(loaded, "all_tied_weights_keys", None) or {})
    assert set(index) == {n for n, _ in loaded.named_parameters()} - tied
    for name, tensor in index.items():
        got, want = tensor.read(), state[name].numpy()
        assert got.dtype == np.float32 and got.shape == want.shape, name
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
    return {t.ggml_type for t in index.values()}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_tiny_gguf_index_equals_transformers_load(family, tmp_path):
    src = source(write_tiny_gguf(tmp_path / f"{family}.gguf", family))
    assert can_stream(src)
    types = assert_index_is_transformers_load(src)
    written = {Q.F32, Q.Q8_0, Q.Q5_0, Q.Q4_0, Q.BF16, Q.Q5_1, Q.Q4_1, Q.Q4_K, Q.F16}
    assert types == written


def test_header_tensor_table_agrees_with_the_gguf_reader(tmp_path):
    """``check_gguf``'s tensor table (what the index and the memory plan read) is gguf's."""
    path = write_tiny_gguf(tmp_path / "llama.gguf", "llama")
    summary = check_gguf(path)
    assert (summary.architecture, summary.little_endian) == ("llama", True)
    want = [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset, t.n_bytes)
        for t in gguf.GGUFReader(str(path)).tensors
    ]
    got = [(t.name, t.dims, t.ggml_type, t.offset, t.num_bytes) for t in summary.tensors]
    assert got == want and len(got) == 2 + 9 * 2 + 1  # embedding, norm, 9 per layer, output


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_streamed_gguf_engine_equals_in_memory_engine(family, tmp_path):
    path = write_tiny_gguf(tmp_path / f"{family}.gguf", family)
    streamed = build(BuildConfig.of(model=str(path), block_size=4, output=str(tmp_path / "s")))
    stats = json.loads((streamed.engine_dir / "manifest.json").read_text())["build_stats"]
    plan = stats["memory_plan"]
    assert plan["streamed"] is True
    src = source(path)
    index = index_gguf(path, meta_model(src).model)
    assert plan["float32_weight_bytes"] == sum(4 * np.prod(t.shape) for t in index.values())
    whole = in_memory_engine(path, tmp_path / "m", 4)
    assert weight_digests(streamed.engine_dir) == weight_digests(whole)
    np.testing.assert_array_equal(prefill_logits(streamed.engine_dir, 4), prefill_logits(whole, 4))


def test_gguf_of_a_merging_architecture_is_loaded_whole(tmp_path):
    """GPT-2's processor writes ``output.weight`` into the state dict itself: not one tensor to
    one weight, so its files take the in-memory path."""
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.add_tensor("output.weight", np.ones((2, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert not can_stream_gguf(tmp_path / "gpt2.gguf")
    assert not can_stream(source(tmp_path / "gpt2.gguf"))
