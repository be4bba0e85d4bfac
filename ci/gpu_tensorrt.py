"""Part 5 of ``ci/gpu_acceptance.py``: ``llmc build`` of tiny Llama and Gemma 3 engines for cpu
and for this GPU's smXX (where ``import tensorrt`` works), their greedy generations compared."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tensorrt_part(arch: int | None, min_match: int) -> bool | None:
    """Build tiny Llama and Gemma 3 engines for cpu and for this GPU, compare greedy tokens (at
    least ``min_match`` of 16 equal per prompt). Returns None when skipped."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as error:
        print(f"\nSKIP tensorrt: `import tensorrt` failed ({error}); install TensorRT 11's "
              "Python package to build and run an engine")  # fmt: skip
        return None
    from llmc.compiler.config.build_config import GPU_TARGETS

    target = f"sm{arch}"
    if arch is None or target not in GPU_TARGETS:
        print(f"\nSKIP tensorrt: no GPU target for this device ({target}); llmc builds "
              f"{', '.join(GPU_TARGETS)}")  # fmt: skip
        return None
    sys.path.insert(0, str(REPO))
    from llmc.runtime.llm import LLM
    from llmc.runtime.sampling_params import SamplingParams
    from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

    prompts = ["To be, or not to be", "ROMEO:", "First Citizen:\nBefore we proceed"]
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ok = True
    print(f"\nTensorRT: tiny engines for cpu and {target}, greedy tokens compared")
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("llama", make_tiny_llama), ("gemma3", make_tiny_gemma3)):
            try:
                ckpt = make(Path(tmp) / name / "ckpt", sharp=True)
            except (ImportError, OSError) as error:  # transformers, or the tokenizer's text
                print(f"  SKIP tensorrt: cannot make the tiny {name} checkpoint ({error})")
                return None
            tokens = {}
            for arch_name in ("cpu", target):
                engine = Path(tmp) / name / arch_name
                command = [sys.executable, "-m", "llmc.cli", "build", str(ckpt), "--arch",
                           arch_name, "--dtype", "float32", "-o", str(engine)]  # fmt: skip
                built = subprocess.run(command, capture_output=True, text=True)
                if built.returncode != 0:
                    print(f"  {name} {arch_name}: FAIL build exit {built.returncode}\n"
                          f"{built.stdout[-2000:]}{built.stderr[-2000:]}")  # fmt: skip
                    ok = False
                    break
                outputs = LLM(engine).generate(prompts, greedy)
                tokens[arch_name] = [o.outputs[0].token_ids for o in outputs]
            else:
                for prompt, cpu, gpu in zip(prompts, tokens["cpu"], tokens[target], strict=True):
                    same = next(
                        (i for i, (a, b) in enumerate(zip(cpu, gpu, strict=True)) if a != b),
                        len(cpu),
                    )
                    verdict = "ok" if same >= min_match else "FAIL"
                    ok &= same >= min_match
                    print(f"  {name:<7}{prompt[:24]!r:<28} {same:>2}/16 tokens equal  {verdict}")
    return ok
