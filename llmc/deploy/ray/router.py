"""Prefix-aware request routing for engine replicas, on Ray Serve's request-router API.

A request goes to the replica that holds the longest prefix of its prompt in its prefix cache,
so that prefill of a shared system prompt runs once per replica that serves it rather than on
every replica; otherwise (no replica holds a prefix, or the holder is far busier than the rest)
to the less loaded of two random replicas (power of two choices). What a replica holds is known
two ways: replicas report the prefix hashes they served (``EngineReplica.record_routing_stats``,
every ``request_routing_stats_period_s``), which every router in the cluster reads; and each
router remembers where it sent prefixes since (fresh between reports). The keys are the engine's
own prefix-cache block hashes (`request.prefix_hashes`). The idea is SGLang's cache-aware router
and the Gateway API Inference Extension's prefix scorer; the routing loop, queue probes and
back-off are Ray's.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from llmc.deploy.ray.request import ReplicaRequest


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Routes each request to the replica holding its longest cached prefix (see the module).

    Ray constructs it; `initialize_state` takes ``request_router_kwargs``.
    """

    def initialize_state(self, max_imbalance: int = 8, remembered_prefixes: int = 65536) -> None:
        """Ray's hook for the router's own state.

        Args:
            max_imbalance: the holder of a prefix is skipped when its queue (ongoing requests,
                Ray's cached probe) exceeds the shortest queue by more than this.
            remembered_prefixes: prefix hashes this router remembers routing (LRU).
        """
        self._max_imbalance = max_imbalance
        self._capacity = remembered_prefixes
        self._routed: OrderedDict[bytes, ReplicaID] = OrderedDict()
        self._reported: dict[ReplicaID, tuple[list[bytes], frozenset[bytes]]] = {}

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """Ranks of replicas to try, best first: the prefix holder (when there is one and it
        is not overloaded), then two random replicas (Ray takes the less loaded)."""
        if not candidate_replicas:
            return []
        pair = random.sample(candidate_replicas, min(2, len(candidate_replicas)))
        holder = self._holder(_hashes(pending_request), candidate_replicas)
        if holder is None or self._overloaded(holder, candidate_replicas):
            return [pair]
        rest = [r for r in pair if r.replica_id != holder.replica_id]
        return [[holder], rest] if rest else [[holder]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: object
    ) -> None:
        """Ray's hook after routing: remember that ``replica_id`` now holds the prefixes."""
        for h in _hashes(pending_request):
            self._routed[h] = replica_id
            self._routed.move_to_end(h)
        while len(self._routed) > self._capacity:
            self._routed.popitem(last=False)

    def _holder(
        self, hashes: tuple[bytes, ...], candidates: list[RunningReplica]
    ) -> RunningReplica | None:
        """The candidate holding the longest prefix of ``hashes`` (reported or routed here)."""
        by_id = {r.replica_id: r for r in candidates}
        reported = {r.replica_id: self._reported_set(r) for r in candidates}
        for h in reversed(hashes):
            routed = self._routed.get(h)
            if routed in by_id:
                return by_id[routed]
            for replica_id, held in reported.items():
                if h in held:
                    return by_id[replica_id]
        return None

    def _reported_set(self, replica: RunningReplica) -> frozenset[bytes]:
        """The prefix hashes ``replica`` last reported, as a set (built once per report)."""
        hashes = (replica.routing_stats or {}).get("prefix_hashes", [])
        cached = self._reported.get(replica.replica_id)
        if cached is None or cached[0] is not hashes:
            cached = (hashes, frozenset(hashes))
            self._reported[replica.replica_id] = cached
        return cached[1]

    def _overloaded(self, holder: RunningReplica, candidates: list[RunningReplica]) -> bool:
        queues = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) for r in candidates}
        known = [q for q in queues.values() if q is not None]
        mine = queues[holder.replica_id]
        return mine is not None and bool(known) and mine - min(known) > self._max_imbalance


def _hashes(pending_request: PendingRequest | None) -> tuple[bytes, ...]:
    """The request's prefix hashes; () for a call that is not a `ReplicaRequest`."""
    if pending_request is None or not pending_request.args:
        return ()
    request = pending_request.args[0]
    return request.prefix_hashes if isinstance(request, ReplicaRequest) else ()
