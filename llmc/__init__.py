"""llmc: an ahead-of-time compiler and engine builder for LLM inference.

``from llmc import LLM, SamplingParams, LoRARequest`` is the Python API; heavy modules load
on first use.
"""

from llmc.version import __version__

__all__ = ["LLM", "LoRARequest", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from llmc.runtime.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmc.runtime.sampling_params import SamplingParams

        return SamplingParams
    if name == "LoRARequest":
        from llmc.runtime.lora.lora_request import LoRARequest

        return LoRARequest
    raise AttributeError(name)
