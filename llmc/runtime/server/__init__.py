"""The OpenAI-compatible HTTP server (DESIGN §7): ``serve`` runs it with a ``ServeConfig``,
``build_app`` builds the FastAPI app around an ``AsyncLLMEngine``."""

from llmc.runtime.server.api_server import serve
from llmc.runtime.server.app import build_app
from llmc.runtime.server.async_engine import AsyncLLMEngine
from llmc.runtime.server.errors import ApiError, EngineDeadError, QueueFullError
from llmc.runtime.server.serve_config import ServeConfig

__all__ = [
    "AsyncLLMEngine",
    "ApiError",
    "EngineDeadError",
    "QueueFullError",
    "ServeConfig",
    "build_app",
    "serve",
]
