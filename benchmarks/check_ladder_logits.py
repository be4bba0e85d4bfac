"""Does an engine built from a size-ladder checkpoint compute what the checkpoint computes?

Random weights make generated text meaningless, so the check is numeric: the logits of one
prefill of ``--tokens`` tokens through the engine (``OrtRunner``, the runtime's runner) against
transformers' float32 forward of the checkpoint on the same tokens. Reports the largest
absolute difference over the logits' scale (their largest magnitude) and whether the greedy
next token agrees at every position. The engine runs first and is released before the
checkpoint is loaded, so the host holds one float32 copy of the weights at a time (a 3B
checkpoint: 12.9 GB).

    python benchmarks/check_ladder_logits.py /tmp/ladder/tinyllama-1.1b \\
        /tmp/llmc_build_scale/tinyllama-1.1b-cpu-none
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from llmc.heap import release_freed_memory


def engine_logits(engine_dir: Path, ids: list[int]) -> np.ndarray:
    """[len(ids), V] float32 logits of one prefill of ``ids`` through the engine."""
    from llmc.engine.manifest import read_manifest
    from llmc.runtime.runners.ort_runner import OrtRunner
    from llmc.runtime.runners.step_inputs import single_prefill

    block = read_manifest(engine_dir).block_size
    blocks = -(-len(ids) // block)
    return OrtRunner(engine_dir, blocks + 1).execute(single_prefill(np.array(ids), block))


def torch_logits(checkpoint: Path, ids: list[int]) -> np.ndarray:
    """[len(ids), V] float32 logits of transformers' forward (float32, eager attention)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def main(argv: list[str] | None = None) -> int:
    """Compare; print one JSON object; exit 1 when the greedy tokens differ anywhere."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("engine")
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args(argv)
    ids = [(37 * i + 11) % 3000 + 3 for i in range(args.tokens)]
    ours = engine_logits(Path(args.engine), ids)
    release_freed_memory()  # the engine's weights, before the checkpoint's are loaded
    theirs = torch_logits(Path(args.checkpoint), ids)
    scale = float(np.abs(theirs).max())
    rel = float(np.abs(ours - theirs).max()) / scale
    same = bool((ours.argmax(-1) == theirs.argmax(-1)).all())
    print(json.dumps({"engine": args.engine, "max_abs_diff_over_scale": rel, "greedy_equal": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
