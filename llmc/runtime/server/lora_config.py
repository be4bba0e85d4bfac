"""``LoRAConfig``: the LoRA options of ``llmc serve`` (vLLM's names), one group of
``ServeConfig``."""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmc.errors import EngineConfigError
from llmc.runtime.server.serve_option import opt


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters on an engine built with ``--enable-lora`` (vLLM's names).

    Raises:
        EngineConfigError: a module that is not ``name=path`` or vLLM's JSON form, a name given
            twice, ``max_cpu_loras`` below 1.
    """

    lora_modules: list[str] | None = opt(
        None,
        "LoRA adapters served from the start, as name=path (a PEFT directory) or vLLM's JSON "
        '{"name": ..., "path": ...}; requests choose one by its name as model',
        metavar="NAME=PATH",
        nargs="+",
    )
    max_cpu_loras: int | None = opt(
        None, "adapters kept loaded in host memory (default: the engine's LoRA slots)"
    )
    allow_runtime_lora_updating: bool = opt(
        False,
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (also on with "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)",
    )

    def __post_init__(self) -> None:
        if self.max_cpu_loras is not None and self.max_cpu_loras < 1:
            raise EngineConfigError(f"max_cpu_loras must be >= 1, got {self.max_cpu_loras}")
        names = [name for name, _ in self.modules]
        if len(set(names)) != len(names):
            raise EngineConfigError(f"lora_modules names an adapter twice: {names}")

    @property
    def modules(self) -> list[tuple[str, str]]:
        """``lora_modules`` as (name, path) pairs. Raises EngineConfigError for one that is
        neither form."""
        pairs = []
        for spec in self.lora_modules or []:
            if spec.lstrip().startswith("{"):
                try:
                    d = json.loads(spec)
                    pairs.append((str(d["name"]), str(d["path"])))
                except (ValueError, KeyError, TypeError) as exc:
                    raise EngineConfigError(f"lora_modules: {spec!r} is not valid: {exc}") from exc
                continue
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise EngineConfigError(f"lora_modules: {spec!r} is not name=path")
            pairs.append((name, path))
        return pairs

    def runtime_updating(self, environ) -> bool:
        """Whether the load/unload routes are served: the option, or vLLM's variable."""
        flag = environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
        return self.allow_runtime_lora_updating or flag
