"""``LoRARequest``: which adapter serves a request (vLLM's ``vllm.lora.request.LoRARequest``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter by name, id and PEFT directory, as vLLM spells it.

    Attributes:
        lora_name: the adapter's name (the ``model`` a server request gives to use it).
        lora_int_id: a caller's id for it, unique per adapter (kept for vLLM's interface; the
            engine keys adapters by name).
        lora_path: its PEFT directory (``adapter_config.json``, ``adapter_model.safetensors``).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str
