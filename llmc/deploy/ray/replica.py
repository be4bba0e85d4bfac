"""One Ray Serve replica: an llmc engine on its own thread, streaming outputs to the ingress."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ray import serve

from llmc.deploy.ray.request import ReplicaOutput, ReplicaRequest
from llmc.runtime.server.api_server import start_engine
from llmc.runtime.server.serve_config import ServeConfig

#: Prefix hashes a replica remembers and reports (`EngineReplica.record_routing_stats`).
REPORTED_PREFIXES = 4096


@dataclass(frozen=True)
class EngineFacts:
    """What the ingress needs to validate and encode requests without an engine of its own.

    Attributes:
        tokenizer: the model's Hugging Face tokenizer.
        max_model_len: the longest prompt plus output, tokens.
        vocab_size: columns of the logits.
        block_size: tokens per KV block (the prefix-cache keys' granularity).
    """

    tokenizer: Any
    max_model_len: int
    vocab_size: int
    block_size: int


class EngineReplica:
    """The body of the engine deployment: loads and runs one engine per replica.

    Each replica loads the engine directory itself, so each checks its own host (a replica on a
    mismatched host fails to start, with ``from_engine_dir``'s reason, and Ray reports it).

    Args:
        engine_dir: the engine directory, as seen from the replica's node.
        config: `ServeConfig.to_dict` of the options; the engine and lifecycle groups apply.
        expected_manifest_sha256: the registry's digest of ``manifest.json``, or None.

    Raises:
        As ``LLMEngine.from_engine_dir``.
    """

    def __init__(
        self, engine_dir: str, config: dict[str, Any], expected_manifest_sha256: str | None
    ) -> None:
        self._engine = start_engine(
            engine_dir, ServeConfig.from_dict(config), expected_manifest_sha256
        )
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._served: OrderedDict[bytes, None] = OrderedDict()

    def describe(self) -> EngineFacts:
        """The engine's tokenizer and limits (the ingress asks once, at start)."""
        e = self._engine
        return EngineFacts(e.tokenizer, e.max_model_len, e.vocab_size, e.block_size)

    async def generate(self, request: ReplicaRequest) -> AsyncIterator[ReplicaOutput]:
        """Run one request; yield its cumulative outputs with this replica's id and stats.

        Raises:
            As ``AsyncLLMEngine.generate``; Ray re-raises it in the caller (an instance of the
            same class). Cancelling the call (the client went away) aborts the request.
        """
        self._remember(request.prefix_hashes)
        outputs = self._engine.generate(
            request.prompt_token_ids, request.params, request.request_id, request.prompt
        )
        async for output in outputs:
            yield ReplicaOutput(output, self._replica_id, self._engine.stats)

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve's routing-stats hook: the prefix hashes this replica served last (its
        prefix cache holds those it has not evicted), newest last, and its queue."""
        return {
            "prefix_hashes": list(self._served),
            "num_waiting": self._engine.num_waiting,
        }

    def check_health(self) -> None:
        """Ray Serve's health hook.

        Raises:
            RuntimeError: the engine thread has stopped (Ray replaces the replica).
        """
        if not self._engine.is_running:
            raise RuntimeError("the llmc engine thread has stopped")

    def __del__(self) -> None:
        """Ray Serve's shutdown hook (after the graceful drain): stop the engine thread."""
        engine = getattr(self, "_engine", None)  # None when the engine failed to load
        if engine is not None:
            engine.shutdown()

    def _remember(self, hashes: tuple[bytes, ...]) -> None:
        for h in hashes:
            self._served[h] = None
            self._served.move_to_end(h)
        while len(self._served) > REPORTED_PREFIXES:
            self._served.popitem(last=False)
