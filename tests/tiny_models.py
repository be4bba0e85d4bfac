"""Tiny random-weight HF checkpoints with a real (trained) tokenizer, built inside the tests."""

from __future__ import annotations

from pathlib import Path

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer(out_dir: Path, vocab_size: int = 512) -> None:
    """Train a byte-level BPE tokenizer on tinyshakespeare and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<bos>", "<eos>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = SHAKESPEARE.read_text()[:200_000]
    tok.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


# What both tiny models share: 2 layers, hidden 64, 4 query heads, the tokenizer's 512 ids and
# its special tokens (<bos> 0, <eos> 1, <pad> 2).
_TINY_CONFIG = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}


def _save(model, out_dir: Path) -> Path:  # noqa: ANN001
    """Write ``model`` (safetensors) and the trained tokenizer to ``out_dir``."""
    model.save_pretrained(out_dir, safe_serialization=True)
    train_tokenizer(out_dir)
    return out_dir


def _sharpen_attention(model, factor: float = 12.0) -> None:
    """Scale q/k projections: at init scale attention is nearly uniform, and greedy tokens would
    not notice a wrong position, window or context."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(factor)


def make_tiny_llama(out_dir: Path, seed: int = 0, sharp: bool = False, **sizes) -> Path:
    """Write a 2-layer Llama (hidden 64, 4 heads, 2 KV heads: GQA) checkpoint to ``out_dir``;
    ``sharp`` scales q/k up so attention is far from uniform; ``sizes`` override the config's
    (``vocab_size=32000``: a checkpoint of tens of MB)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = _TINY_CONFIG | sizes
    cfg = LlamaConfig(**config, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    if sharp:
        _sharpen_attention(model)
    return _save(model, out_dir)


def make_tiny_gemma3(
    out_dir: Path, seed: int = 0, sharp: bool = False, hidden_size: int | None = None
) -> Path:
    """Write a 2-layer Gemma 3 text model: MQA, one sliding (window 8) and one global layer;
    ``sharp`` as in ``make_tiny_llama``; ``hidden_size`` other than 64 (e.g. 128: a whole
    quantization block per row)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    sizes = {} if hidden_size is None else dict(hidden_size=hidden_size)
    cfg = Gemma3TextConfig(
        **(_TINY_CONFIG | sizes),
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
    )
    model = Gemma3ForCausalLM(cfg).eval()
    # Random init leaves norms at 0 (Gemma's RMSNorm scales by 1 + w); perturb them so the
    # norms, q/k norms and the offset are all exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.1)
    if sharp:
        _sharpen_attention(model, 4.0)
    return _save(model, out_dir)


def bfloat16_copy(ckpt: Path, out: Path) -> Path:
    """``ckpt`` saved by transformers in bfloat16 (every tensor), tokenizer beside it."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmc.compiler.weights.checkpoint_weights import index_safetensors

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    model.save_pretrained(out)
    for f in ckpt.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (out / f.name).write_bytes(f.read_bytes())
    assert {
        loc.dtype.name for loc in index_safetensors(list(out.glob("*.safetensors"))).values()
    } == {"BFLOAT16"}
    return out


def calibration_text(root: Path) -> Path:
    """A calibration/held-out text file (the first 60,000 characters of tinyshakespeare) in
    ``root``."""
    data = root / "calib.txt"
    data.write_text(SHAKESPEARE.read_text()[:60_000])
    return data


def quant_config(model: Path, root: Path, data: Path, quant: str, name: str, **kw):
    """A small quantized build of ``model`` into ``root / name``: 8-token blocks, 4 calibration
    windows of 64 tokens from ``data``, 2 held-out windows, statistics cached in ``root``;
    ``kw`` sets or overrides any other option by its flat name."""
    from llmc.compiler.config.build_config import BuildConfig

    options = {
        "block_size": 8,
        "max_seq_len": 128,
        "calib_samples": 4,
        "calib_seq_len": 64,
        "eval_samples": 2,
        "cache_dir": str(root / "cache"),
    } | kw
    return BuildConfig.of(
        model=str(model), quant=quant, calib_data=str(data), output=str(root / name), **options
    )
