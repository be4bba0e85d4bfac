"""llmc: an ahead-of-time compiler and engine builder for LLM inference.

``from llmc import LLM, SamplingParams`` is the Python API; heavy modules load on first use.
"""

import os

# Set before anything loads an OpenMP runtime (torch's libgomp is the one our kernel binds to):
# the attention kernel's OpenMP team and ONNX Runtime's pool take turns on the same cores once
# per layer, and OpenMP's default spin-wait steals the cores ORT needs next (DESIGN notes: a
# Gemma 3 270M decode step took 150 ms instead of 50 ms on 2 cores). A user's setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from llmc.version import __version__  # noqa: E402

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from llmc.runtime.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmc.runtime.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
