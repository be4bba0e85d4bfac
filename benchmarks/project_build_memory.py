"""What ``llmc build``'s memory plan projects for models too large to build here: the peak host
memory of each ``--quant`` for Llama-3.2-3B, Llama-3.1-8B and Llama-3.1-70B shapes (the
formula of ``llmc.compiler.memory.plan``, checked against measured builds of the size ladder
in ``benchmarks/RESULTS.md``).

    python benchmarks/project_build_memory.py [--calib-samples 64 --calib-seq-len 256]

Two figures per build: a GPU target's portable stage (no engine loaded on the CI runner) and a
``cpu`` engine (the build loads the engine to measure it, as a server would hold it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transformers import LlamaConfig

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.engine_size import CheckpointShapes
from llmc.compiler.memory.plan import GB, plan_for_shapes

sys.path.insert(0, str(Path(__file__).parent))
from make_size_ladder import RUNGS, tensor_shapes  # noqa: E402

LLAMA_3_1 = dict(
    vocab_size=128256,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
MODELS = {
    "Llama-3.2-3B": LlamaConfig(**RUNGS["llama-3.2-3b"].fields),
    "Llama-3.1-8B": LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        **LLAMA_3_1,
    ),
    "Llama-3.1-70B": LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        **LLAMA_3_1,
    ),
}


def main(argv: list[str] | None = None) -> int:
    """Print the projection table (GB = 1e9 bytes) for ``argv`` (the module docstring's
    flags); returns the exit code, 0."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calib-samples", type=int, default=64)
    p.add_argument("--calib-seq-len", type=int, default=256)
    args = p.parse_args(argv)
    tokens = args.calib_samples * args.calib_seq_len
    print(f"calibration: {args.calib_samples} x {args.calib_seq_len} tokens; GB = 1e9 bytes")
    print("| build | " + " | ".join(MODELS) + " |")
    print("|---" * (len(MODELS) + 1) + "|")
    shapes = {m: CheckpointShapes(tuple(tensor_shapes(c)), False) for m, c in MODELS.items()}
    weights = " | ".join(_gb(s.float32_bytes()[0]) for s in shapes.values())
    print(f"| float32 weights | {weights} |")
    for quant in ("none", "int8", "int4"):
        spec = BuildConfig.of(model="-", quant=quant).quant_spec() if quant != "none" else None
        cells = []
        for s in shapes.values():
            gpu = plan_for_shapes(s, True, quant, False, None, spec, tokens)
            cpu = plan_for_shapes(s, True, quant, True, None, spec, tokens)
            cells.append(
                f"engine {_gb(cpu.engine_weight_bytes)}; GPU stage {_gb(gpu.need_bytes)}, "
                f"cpu engine {_gb(cpu.need_bytes)}"
            )
        print(f"| `--quant {quant}` | " + " | ".join(cells) + " |")
    return 0


def _gb(n: int) -> str:
    return f"{n / GB:.1f} GB"


if __name__ == "__main__":
    sys.exit(main())
