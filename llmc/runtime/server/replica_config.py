"""``ReplicaConfig``: the options of ``llmc serve`` that run engine replicas on Ray Serve
(``llmc.deploy.ray``; Ray's key names), one group of ``ServeConfig``."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.errors import EngineConfigError
from llmc.runtime.server.serve_option import opt


@dataclass(frozen=True)
class ReplicaConfig:
    """Engine replicas on Ray Serve (``llmc.deploy.ray``; Ray's key names). None set: one
    engine in this process.

    Raises:
        EngineConfigError: a count below 1, ``min_replicas`` above ``max_replicas``, a target
            that is not positive, or ``num_replicas`` with autoscaling bounds.
    """

    num_replicas: int | None = opt(
        None,
        "run this many engine replicas on Ray Serve behind one OpenAI app (pip install "
        '"llmc[ray]"); default: one engine in this process',
        metavar="N",
    )
    min_replicas: int | None = opt(
        None, "autoscale the engine replicas on Ray Serve from this many", metavar="N"
    )
    max_replicas: int | None = opt(None, "... up to this many", metavar="N")
    target_ongoing_requests: float = opt(
        8.0,
        "autoscaling's target of requests in each replica's engine (queued or running): more "
        "adds replicas, fewer removes them",
        metavar="N",
    )
    upscale_delay_s: float = opt(
        30.0, "autoscaling: seconds of load above target before replicas are added", metavar="S"
    )
    downscale_delay_s: float = opt(
        600.0, "autoscaling: seconds of load below target before replicas are removed", metavar="S"
    )
    replica_num_cpus: float = opt(1.0, "CPUs Ray reserves per engine replica", metavar="N")
    prefix_routing: bool = opt(
        True,
        "route a request to the replica holding its prompt's prefix in its prefix cache (else "
        "Ray's power of two choices)",
        flag="--no-prefix-routing",
    )
    ray_address: str | None = opt(
        None,
        "Ray cluster to join (ray.init's address, e.g. auto); default: start one here",
        metavar="ADDRESS",
    )

    def __post_init__(self) -> None:
        counts = {n: getattr(self, n) for n in ("num_replicas", "min_replicas", "max_replicas")}
        low = [f"{n}={v}" for n, v in counts.items() if v is not None and v < 1]
        if low:
            raise EngineConfigError(f"replica counts must be >= 1, got {', '.join(low)}")
        if self.num_replicas is not None and self.autoscaling:
            raise EngineConfigError(
                "give num_replicas, or min_replicas/max_replicas to autoscale, not both"
            )
        lo, hi = self.min_replicas or 1, self.max_replicas
        if hi is not None and lo > hi:
            raise EngineConfigError(f"min_replicas {lo} is above max_replicas {hi}")
        if not self.target_ongoing_requests > 0:
            raise EngineConfigError(
                f"target_ongoing_requests must be > 0, got {self.target_ongoing_requests}"
            )
        negative = [
            f"{n}={getattr(self, n)}"
            for n in ("upscale_delay_s", "downscale_delay_s", "replica_num_cpus")
            if getattr(self, n) < 0
        ]
        if negative:
            raise EngineConfigError(f"must be >= 0: {', '.join(negative)}")

    @property
    def autoscaling(self) -> bool:
        """Whether min_replicas or max_replicas is set."""
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def enabled(self) -> bool:
        """Whether the engines run as Ray Serve replicas."""
        return self.num_replicas is not None or self.autoscaling
