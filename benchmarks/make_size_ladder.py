"""Write random-weight HF checkpoints with real models' dimensions: the build-scale ladder.

No model hub is reachable here, and a build's memory and time depend on the shapes, not on the
values: each rung is a safetensors checkpoint (bfloat16, sharded at 2 GB like the hub's) with the
config of a published model, random weights (normal, std 0.02; norms at 1), and a byte-level BPE
tokenizer trained on tinyshakespeare (its vocabulary is smaller than the model's, which pads, as
real vocabularies do). Tensors are made and written one shard at a time, so writing a 3B rung
needs about one shard of memory.

    python benchmarks/make_size_ladder.py --out /tmp/ladder                 # every rung
    python benchmarks/make_size_ladder.py --out /tmp/ladder --rungs qwen2.5-0.5b

Dimensions from the models' published ``config.json`` files (Qwen/Qwen2.5-0.5B,
TinyLlama/TinyLlama-1.1B-Chat-v1.0, meta-llama/Llama-3.2-3B).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class Rung:
    """One checkpoint of the ladder: a transformers config class and its fields."""

    name: str
    config_class: str  # transformers class name
    fields: dict


RUNGS = {
    r.name: r
    for r in (
        Rung(
            "qwen2.5-0.5b",
            "Qwen2Config",
            dict(
                vocab_size=151936,
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                max_position_embeddings=32768,
                rope_theta=1000000.0,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
            ),
        ),
        Rung(
            "tinyllama-1.1b",
            "LlamaConfig",
            dict(
                vocab_size=32000,
                hidden_size=2048,
                intermediate_size=5632,
                num_hidden_layers=22,
                num_attention_heads=32,
                num_key_value_heads=4,
                max_position_embeddings=2048,
                rope_theta=10000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
        ),
        Rung(
            "llama-3.2-3b",
            "LlamaConfig",
            dict(
                vocab_size=128256,
                hidden_size=3072,
                intermediate_size=8192,
                num_hidden_layers=28,
                num_attention_heads=24,
                num_key_value_heads=8,
                head_dim=128,
                max_position_embeddings=131072,
                rope_theta=500000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=True,
            ),
        ),
    )
}


def tensor_shapes(config) -> list[tuple[str, tuple[int, ...]]]:
    """Checkpoint tensor names and shapes of a Llama/Qwen2 ``config``, in the hub's order."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    d = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    bias = config.model_type == "qwen2"  # Qwen2 has q/k/v biases
    shapes = [("model.embed_tokens.weight", (v, h))]
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
        if bias:
            shapes += [
                (p + f"self_attn.{x}_proj.bias", (s,)) for x, s in (("q", q), ("k", kv), ("v", kv))
            ]
    shapes.append(("model.norm.weight", (h,)))
    if not config.tie_word_embeddings:
        shapes.append(("lm_head.weight", (v, h)))
    return shapes


def write_weights(config, out: Path, seed: int) -> int:
    """Write random bfloat16 weights as ``model-0000k-of-0000n.safetensors`` shards with the
    hub's ``model.safetensors.index.json``; returns the parameter count."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    shapes = tensor_shapes(config)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * _numel(shape)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map = {}
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
                tensors[name] = t.to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        del tensors
    total = sum(_numel(s) for _, s in shapes)
    index = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def write_tokenizer(out: Path, vocab_size: int = 4096) -> None:
    """A byte-level BPE tokenizer trained on tinyshakespeare, saved as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = SHAKESPEARE.read_text()
    tok.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.save_pretrained(out)


def make_rung(rung: Rung, out: Path, seed: int = 0) -> int:
    """Write ``rung``'s checkpoint into ``out`` (config, weights, tokenizer); returns its
    parameter count."""
    import transformers

    config = getattr(transformers, rung.config_class)(
        **rung.fields, bos_token_id=0, eos_token_id=1, pad_token_id=2, torch_dtype="bfloat16"
    )
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    total = write_weights(config, out, seed)
    write_tokenizer(out)
    return total


def main(argv: list[str] | None = None) -> int:
    """Write the rungs named by ``--rungs`` under ``--out``; print one line per rung."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory; each rung is written to OUT/<rung>")
    p.add_argument("--rungs", default=",".join(RUNGS), help=f"comma-separated of {list(RUNGS)}")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in args.rungs.split(","):
        if name not in RUNGS:
            print(f"unknown rung {name!r}; known: {', '.join(RUNGS)}", file=sys.stderr)
            return 2
        total = make_rung(RUNGS[name], Path(args.out) / name, args.seed)
        print(f"{name}: {total / 1e9:.3f}B parameters -> {Path(args.out) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
