"""``ServeConfig``: every option of ``llmc serve``, one documented field each, in one dataclass
per concern (network and auth, engine limits, request limits, admission and shutdown).

The command's flags, their help and their argument groups come from these fields
(``serve_flags.py``); ``--config serve.yaml`` may set any field by its name, flat (``port: 9000``,
``max_num_seqs: 8``), and the command line wins (`ServeConfig.from_sources`), as
``BuildConfig`` does for ``llmc build``.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from llmc.config_file import read_config_file, short_repr
from llmc.errors import EngineConfigError
from llmc.option_flags import alternatives
from llmc.runtime.server.limits import RequestLimits
from llmc.runtime.server.lora_config import LoRAConfig
from llmc.runtime.server.replica_config import ReplicaConfig
from llmc.runtime.server.serve_option import opt
from llmc.runtime.spec_decode.speculative_config import SpeculativeConfig

#: uvicorn's log levels.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class HttpConfig:
    """Where the server listens and who may call it.

    Raises:
        EngineConfigError: a port (HTTP or gRPC) outside 0..65535.
    """

    host: str = opt("127.0.0.1", "interface to bind; the default serves only this machine")
    port: int = opt(8000, "TCP port (0: any free port)")
    grpc_port: int | None = opt(
        None,
        "also serve KServe v2 over gRPC (GRPCInferenceService, Triton's generate tensors) on "
        'this port of the same host (pip install "llmc[grpc]"); default: no gRPC',
        metavar="PORT",
    )
    served_model_name: str | None = opt(
        None,
        "the model name clients send (default: the registry's model id, else the engine "
        "directory's name)",
        metavar="NAME",
    )
    api_key: str | None = opt(
        None,
        "require this bearer token on every route but /health, /ready, /metrics (default: "
        "$LLMC_API_KEY; the command line is visible to other users, the file and the variable "
        "are not)",
        metavar="KEY",
    )
    api_key_file: str | None = opt(None, "read the API key from this file", metavar="PATH")
    allowed_origins: list[str] | None = opt(
        None,
        "a CORS origin allowed to call the API ('*' for any; repeatable); default: CORS off",
        metavar="ORIGIN",
    )

    def __post_init__(self) -> None:
        for name in ("port", "grpc_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise EngineConfigError(f"{name} must be in 0..65535, got {port}")


@dataclass(frozen=True)
class EngineLimits:
    """How the engine runs: its batch limits and its KV cache. None: the engine's build limits
    (``max_batch``, ``max_num_tokens``, ``max_seq_len`` of its manifest); the engine checks
    them when it loads (``EngineConfigError``).

    Raises:
        EngineConfigError: a KV-cache budget that is not positive, a negative
            ``max_decode_wait_steps``.
    """

    max_num_seqs: int | None = opt(
        None, "most sequences per step (default: the engine's max_batch)"
    )
    max_num_batched_tokens: int | None = opt(
        None, "token budget per step (default: the engine's max_num_tokens; at most 384 on cpu)"
    )
    max_num_forked_seqs: int | None = opt(
        None,
        "most running completions 1..n-1 of n > 1 requests, so one large-n request cannot "
        "crowd out new ones (default: half of --max-num-seqs)",
    )
    max_decode_wait_steps: int | None = opt(
        None,
        "prefill first: most consecutive steps running requests' decodes wait while new "
        "prompts are prefilled; 0: decodes always first (default: 8 on cpu, 0 otherwise)",
    )
    max_model_len: int | None = opt(
        None, "longest prompt + output, tokens (default: the engine's max_seq_len)"
    )
    kv_cache_memory: float | None = opt(None, "KV-cache budget in GiB (default 2)", metavar="GIB")
    enable_prefix_caching: bool = opt(
        True,
        "share the KV blocks of common prompt prefixes between requests",
        flag="--no-prefix-caching",
    )
    speculative_config: str | None = opt(
        None,
        'speculative decoding as vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": '
        '4, "prompt_lookup_max": 4} or {"method": "draft", "num_speculative_tokens": 3, '
        '"model": DRAFT_ENGINE_DIR} (default: off)',
        metavar="JSON",
    )

    def __post_init__(self) -> None:
        if self.max_decode_wait_steps is not None and self.max_decode_wait_steps < 0:
            raise EngineConfigError(
                f"max_decode_wait_steps must be >= 0 (0: decodes first), got "
                f"{self.max_decode_wait_steps}"
            )
        if self.kv_cache_memory is not None and not self.kv_cache_memory > 0:
            raise EngineConfigError(
                f"kv_cache_memory must be a positive number of GiB, got {self.kv_cache_memory}"
            )
        self.speculative  # noqa: B018 -- refuses a bad JSON or config before the engine loads

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """``speculative_config`` parsed; None when off.

        Raises:
            EngineConfigError: not a JSON object, or a config `SpeculativeConfig` refuses.
        """
        if self.speculative_config is None:
            return None
        try:
            values = json.loads(self.speculative_config)
            if not isinstance(values, dict):
                raise ValueError("not a JSON object")
            return SpeculativeConfig.from_dict(values)
        except (ValueError, TypeError) as exc:
            raise EngineConfigError(f"speculative_config: {exc}") from exc

    @property
    def kv_cache_bytes(self) -> int | None:
        """``kv_cache_memory`` in bytes; None: the loader's default."""
        if self.kv_cache_memory is None:
            return None
        return int(self.kv_cache_memory * (1 << 30))


@dataclass(frozen=True)
class LifecycleConfig:
    """Admission, health and shutdown of the server process.

    Raises:
        EngineConfigError: a negative ``max_waiting`` or ``shutdown_timeout``, fewer than one
            grammar compile worker or a timeout that is not positive.
    """

    max_waiting: int = opt(64, "requests waiting for their first token before new ones get 503")
    max_consecutive_step_failures: int = opt(
        3,
        "engine steps in a row whose model runner failed after which the server reports itself "
        "dead (/health 503); a single failed step only fails the requests it carried, and a "
        "request's own failure (its constraint) never counts",
    )
    grammar_compile_workers: int = opt(
        2, "threads compiling structured-output constraints, off the engine thread"
    )
    grammar_compile_timeout: float = opt(
        10.0,
        "seconds a request may wait for its constraint to compile: past it a 400 (503 when no "
        "worker was free)",
        metavar="SECONDS",
    )
    shutdown_timeout: float = opt(
        30.0,
        "seconds in-flight requests may run after SIGTERM; then they are aborted",
        metavar="SECONDS",
    )
    log_level: str = opt("info", "uvicorn's log level", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        for name in ("max_waiting", "shutdown_timeout"):
            if getattr(self, name) < 0:
                raise EngineConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.grammar_compile_workers < 1 or not self.grammar_compile_timeout > 0:
            raise EngineConfigError(
                "grammar_compile_workers must be >= 1 and grammar_compile_timeout > 0, got "
                f"{self.grammar_compile_workers} and {self.grammar_compile_timeout}"
            )
        if self.log_level not in LOG_LEVELS:
            raise EngineConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, "
                f"got {short_repr(self.log_level)}"
            )


@dataclass(frozen=True)
class TracingConfig:
    """Where request spans go (OpenTelemetry; ``tracing.py``)."""

    otlp_traces_endpoint: str | None = opt(
        None,
        "export one OpenTelemetry span per request to this OTLP/HTTP traces URL (e.g. "
        "http://collector:4318/v1/traces); a caller's traceparent header is its parent. Needs "
        'pip install "llmc[otel]"; default: no tracing',
        metavar="URL",
    )


def _group(cls: type, title: str, description: str | None = None) -> Any:
    return field(default_factory=cls, metadata={"title": title, "description": description})


@dataclass(frozen=True)
class ServeConfig:
    """Every option of ``llmc serve``, by concern; each group's fields are flags of the same
    name, and keys of a ``--config`` file (one flat mapping: option names are unique across the
    groups)."""

    http: HttpConfig = _group(HttpConfig, "network and auth")
    engine: EngineLimits = _group(EngineLimits, "engine limits")
    limits: RequestLimits = _group(
        RequestLimits,
        "request limits",
        "Past a limit a request gets a 400 naming the field and the limit (413 for the body); "
        "max_tokens is bounded by --max-model-len.",
    )
    lifecycle: LifecycleConfig = _group(LifecycleConfig, "admission and shutdown")
    tracing: TracingConfig = _group(TracingConfig, "tracing")
    lora: LoRAConfig = _group(
        LoRAConfig, "LoRA adapters", "adapters served by name on an engine built with --enable-lora"
    )
    replicas: ReplicaConfig = _group(
        ReplicaConfig,
        "replicas (Ray Serve)",
        "engine replicas behind one OpenAI app, routed by prompt prefix, autoscaled on load",
    )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ServeConfig:
        """The config with ``values`` (option name -> value, flat; ``-`` or ``_`` in names)
        set over the defaults.

        Raises:
            EngineConfigError: an unknown option (naming it and the known ones), a value of the
                wrong type, or one its group refuses.
        """
        values = {k.replace("-", "_"): v for k, v in values.items()}
        unknown = sorted(set(values) - set(OPTION_NAMES))
        if unknown:
            raise EngineConfigError(
                f"unknown serve option(s) {', '.join(unknown)}; known: {', '.join(OPTION_NAMES)}"
            )
        groups = {}
        for group, kind in OPTION_GROUPS:
            hints = typing.get_type_hints(kind)
            given = [f.name for f in fields(kind) if f.name in values]
            groups[group.name] = kind(
                **{name: _typed(name, values[name], hints[name]) for name in given}
            )
        return cls(**groups)

    @classmethod
    def from_sources(cls, yaml_path: str | Path | None, cli: dict[str, Any]) -> ServeConfig:
        """Merge: defaults < YAML file (a flat mapping of option: value) < command line.

        Raises:
            EngineConfigError: an unreadable file, one that is not a mapping, or as `from_dict`.
        """
        values: dict[str, Any] = {}
        if yaml_path:
            values.update(read_config_file(yaml_path, "serve config", EngineConfigError))
        values.update(cli)
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        """Every option, flat, in flag order (what `from_dict` reads back)."""
        return {
            k: v for group in fields(self) for k, v in asdict(getattr(self, group.name)).items()
        }

    def redacted(self) -> ServeConfig:
        """A copy without the API key's value, for printing."""
        if self.http.api_key is None:
            return self
        return replace(self, http=replace(self.http, api_key="<redacted>"))


#: (field of ServeConfig, its group's dataclass), in flag order.
OPTION_GROUPS = [(f, typing.get_type_hints(ServeConfig)[f.name]) for f in fields(ServeConfig)]
#: Every option name over every group, in flag order (tests/runtime/test_serve_config.py checks
#: that no two groups share one).
OPTION_NAMES = [f.name for _, kind in OPTION_GROUPS for f in fields(kind)]


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the field's type hint (ints become floats where floats are
    expected); EngineConfigError naming the option otherwise."""
    options = alternatives(hint)
    if value is None and type(None) in options:
        return None
    for kind in options:
        if kind is bool and isinstance(value, bool):
            return value
        if isinstance(value, bool):
            continue
        if kind is int and isinstance(value, int):
            return value
        if kind is float and isinstance(value, int | float):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
        if typing.get_origin(kind) is list and isinstance(value, list):
            if all(isinstance(v, str) for v in value):
                return list(value)
    wanted = " or ".join(_KIND_NAMES[typing.get_origin(k) or k] for k in options)
    raise EngineConfigError(f"serve option {name} must be {wanted}, got {short_repr(value)}")


_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list of strings",
    type(None): "null",
}
