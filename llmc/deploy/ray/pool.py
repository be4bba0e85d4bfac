"""The engine replicas as one `EngineClient`: what llmc's OpenAI app runs on in the ingress."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from llmc.deploy.ray.replica import EngineFacts
from llmc.deploy.ray.request import ReplicaOutput, ReplicaRequest, prefix_hashes
from llmc.runtime.lora.errors import LoRAAdapterError, LoRANotFoundError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.outputs import RequestOutput
from llmc.runtime.request_check import check_request
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.server.errors import QueueFullError
from llmc.runtime.server.request_stream import FINISH_OUTCOMES, finish_outcome
from llmc.runtime.stats import EngineStats


class ReplicaPool:
    """Submits requests to the engine deployment through a Ray Serve handle, one replica each
    (placed by the deployment's request router), and streams their outputs back.

    Counts (waiting, running, finished) are this ingress replica's requests; ``stats`` sums the
    latest statistics each engine replica sent with an output (KV usage over the pooled
    blocks). ``replica_requests`` counts the requests each replica took.

    Args:
        handle: the engine deployment's handle (``EngineReplica``).
        facts: the engine's tokenizer and limits (``EngineReplica.describe``).
    """

    def __init__(self, handle: DeploymentHandle, facts: EngineFacts) -> None:
        self.tokenizer: Any = facts.tokenizer
        self.max_model_len = facts.max_model_len
        self._vocab_size = facts.vocab_size
        self._block_size = facts.block_size
        self._handle = handle.options(method_name="generate", stream=True)
        self._open: set[DeploymentResponseGenerator] = set()
        self._running = True
        self._num_waiting = 0
        self._num_finished = dict.fromkeys(FINISH_OUTCOMES, 0)
        self._stats: dict[str, EngineStats] = {}
        self.replica_requests: Counter[str] = Counter()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self._open) - self._num_waiting

    @property
    def num_in_flight(self) -> int:
        return len(self._open)

    @property
    def num_finished(self) -> dict[str, int]:
        return dict(self._num_finished)

    @property
    def stats(self) -> EngineStats:
        return sum_stats(list(self._stats.values()))

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """As ``AsyncLLMEngine.generate``, on whichever replica the router picks (the base
        model: replicas serve no LoRA adapter, ``lora_request`` must be None).

        Raises:
            ValueError: ``check_request`` refused it (before any replica sees it).
            QueueFullError: the routers' queue is full (Ray's ``max_queued_requests``) or the
                replica's engine refused it.
            Whatever the replica's ``generate`` raised (Ray re-raises the same class).
        """
        check_request(prompt_token_ids, params, self._vocab_size, self.max_model_len)
        if lora_request is not None:
            raise LoRAAdapterError(_NO_LORA)
        hashes = prefix_hashes(prompt_token_ids, self._block_size)
        request = ReplicaRequest(list(prompt_token_ids), params, request_id, prompt, hashes)
        response = self._handle.remote(request)
        self._open.add(response)
        self._num_waiting += 1
        waiting, outcome = True, "abort"  # unless it finishes or fails
        try:
            async for item in _outputs(response):
                if waiting:
                    waiting = False
                    self._num_waiting -= 1
                    self.replica_requests[item.replica_id] += 1
                self._stats[item.replica_id] = item.stats
                if item.output.finished:
                    outcome = finish_outcome(item.output)
                yield item.output
        except ValueError:  # the engine refused it: it never started
            outcome = None
            raise
        except Exception:
            outcome = "error"
            raise
        finally:  # also on GeneratorExit and cancellation: the client went away ("abort")
            if waiting:
                self._num_waiting -= 1
            self._open.discard(response)
            if outcome == "abort":
                response.cancel()  # the replica's generate is cancelled: it aborts the request
            if outcome is not None and not waiting:
                self._num_finished[outcome] += 1

    def lora_request(self, name: str) -> LoRARequest | None:
        """None: replicas serve no LoRA adapter."""
        return None

    @property
    def loras(self) -> list[LoRARequest]:
        return []

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Refused (LoRAAdapterError): replicas serve no LoRA adapter."""
        raise LoRAAdapterError(_NO_LORA)

    async def remove_lora(self, lora_name: str) -> None:
        """Refused (LoRANotFoundError): no adapter is loaded."""
        raise LoRANotFoundError(f"no LoRA adapter named {lora_name!r} is loaded")

    def abort_all(self) -> None:
        """Cancel every open request (each replica aborts its own)."""
        for response in list(self._open):
            response.cancel()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop taking requests; the replicas belong to Ray Serve."""
        self._running = False


async def _outputs(response: DeploymentResponseGenerator) -> AsyncIterator[ReplicaOutput]:
    """The replica's outputs; its exception re-raised as itself (Ray wraps it with the remote
    traceback, which would end up in the client's error message)."""
    try:
        async for item in response:
            yield item
    except BackPressureError as exc:
        raise QueueFullError(f"every engine replica's queue is full ({exc}); retry later") from exc
    except RayTaskError as exc:
        if isinstance(exc.cause, Exception):
            raise exc.cause from None
        raise


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    """The replicas' statistics as one engine's: counts and blocks summed, KV usage over the
    pooled blocks. Empty: all zero."""
    if not stats:
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
    total = {
        f.name: sum(getattr(s, f.name) for s in stats)
        for f in dataclasses.fields(EngineStats)
        if f.name not in _NOT_SUMMED
    }
    blocks = total["num_total_blocks"]
    used = blocks - total["num_free_blocks"]
    return EngineStats(kv_cache_usage=used / blocks if blocks else 0.0, **total)


#: EngineStats fields that are not counts (the KV usage is recomputed; replicas serve no LoRA).
_NOT_SUMMED = {"kv_cache_usage", "running_lora_adapters", "waiting_lora_adapters", "max_lora"}
_NO_LORA = "LoRA adapters are served by `llmc serve` without --num-replicas"


class ReplicaCollector(Collector):
    """``llmc:replica_requests``: requests each engine replica took from this ingress."""

    def __init__(self, pool: ReplicaPool, model_name: str) -> None:
        self.pool = pool
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily(
            "llmc:replica_requests",
            "Requests routed to each engine replica (Ray Serve replica id).",
            labels=["model_name", "replica"],
        )
        for replica, count in sorted(self.pool.replica_requests.items()):
            counter.add_metric([self.model_name, replica], float(count))
        yield counter
