"""What the HTTP app needs of an engine: `EngineClient`.

``AsyncLLMEngine`` (one engine on a thread of this process) is one; a pool of engine replicas
behind a distributed layer (``llmc.deploy.ray.pool.ReplicaPool``) is another. The app, its
serving code, metrics and drain see only this protocol, so every route, validation, error and
metric is the same whichever runs the requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.outputs import RequestOutput
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.stats import EngineStats


class EngineClient(Protocol):
    """An engine the server submits requests to (see ``AsyncLLMEngine`` for the semantics).

    Attributes:
        tokenizer: the model's Hugging Face tokenizer (the server encodes prompts with it).
        max_model_len: the longest prompt plus output, tokens.
    """

    tokenizer: Any
    max_model_len: int

    @property
    def vocab_size(self) -> int:
        """Columns of the model's logits; token ids are below it."""
        ...

    @property
    def is_running(self) -> bool:
        """Whether requests are accepted (``/health``)."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests submitted that have not produced their first output yet."""
        ...

    @property
    def num_running(self) -> int:
        """Requests that have produced output and are not finished."""
        ...

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished."""
        ...

    @property
    def num_finished(self) -> dict[str, int]:
        """Requests ended, by outcome ("stop", "length", "abort", "error")."""
        ...

    @property
    def stats(self) -> EngineStats:
        """The latest statistics (block pool, prefix cache, preemptions)."""
        ...

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request (served by the adapter ``lora_request``; None: the base model);
        yield its cumulative outputs until it finishes. Raises as ``AsyncLLMEngine.generate``
        (``QueueFullError``, ``ValueError``, ...)."""
        ...

    def lora_request(self, name: str) -> LoRARequest | None:
        """The loaded LoRA adapter named ``name``, None if there is none."""
        ...

    @property
    def loras(self) -> list[LoRARequest]:
        """The loaded LoRA adapters, in the order they were added."""
        ...

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter. Raises ``LoRAAdapterError`` for one the engine cannot serve."""
        ...

    async def remove_lora(self, lora_name: str) -> None:
        """Unload an adapter. Raises ``LoRANotFoundError`` (not loaded) or
        ``LoRAAdapterError`` (in use)."""
        ...

    def abort_all(self) -> None:
        """End every unfinished request now (a drain out of time)."""
        ...

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop taking requests and release the engine. Idempotent."""
        ...
