"""The LoRA routes of the server, as vLLM names them: ``POST /v1/load_lora_adapter`` and
``POST /v1/unload_lora_adapter`` (only with runtime LoRA updating allowed, as vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), and the adapters' cards of ``GET /v1/models``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from llmc.runtime.lora.errors import LoRAAdapterError, LoRANotFoundError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.server.engine_client import EngineClient
from llmc.runtime.server.errors import ApiError, bad_request
from llmc.runtime.server.responses import ModelCard


class LoadLoRAAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter``'s body (vLLM's)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    """``POST /v1/unload_lora_adapter``'s body (vLLM's; ``lora_int_id`` is accepted, unused)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None


def adapter_cards(engine: EngineClient, model_name: str) -> list[ModelCard]:
    """One ``/v1/models`` card per loaded adapter: its name, directory and base model."""
    return [
        ModelCard(
            id=r.lora_name, root=r.lora_path, parent=model_name, max_model_len=engine.max_model_len
        )
        for r in engine.loras
    ]


def add_lora_routes(app: FastAPI, engine: EngineClient, model_name: str) -> None:
    """Add the load and unload routes to ``app``: 200 with vLLM's text on success; 400 for an
    adapter the engine cannot serve, a name already used (or the served model's), an adapter
    in use; 404 for unloading one that is not loaded."""

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> str:
        name = body.lora_name
        if name == model_name or engine.lora_request(name) is not None:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        request = LoRARequest(name, len(engine.loras) + 1, body.lora_path)
        try:
            await engine.add_lora(request)
        except LoRAAdapterError as exc:
            raise bad_request(str(exc), "lora_path") from exc
        return f"Success: LoRA adapter '{name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> str:
        name = body.lora_name
        try:
            await engine.remove_lora(name)
        except LoRANotFoundError as exc:
            raise ApiError(404, str(exc), param="lora_name", code="model_not_found") from exc
        except LoRAAdapterError as exc:
            raise bad_request(str(exc), "lora_name") from exc
        return f"Success: LoRA adapter '{name}' removed successfully."
