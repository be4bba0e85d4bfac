"""Read a PEFT LoRA adapter directory and check it against an engine's slots.

Format (``peft`` 0.21, ``save_pretrained``): ``adapter_config.json`` (``peft_type`` "LORA",
``r``, ``lora_alpha``, ``use_rslora``, ``rank_pattern``, ``alpha_pattern``, ...) and
``adapter_model.safetensors`` with ``base_model.model.<module>.lora_A.weight`` [r, K] and
``...lora_B.weight`` [O, r] per adapted Linear. The delta of module m is
``x @ A^T @ B^T * scaling``, scaling = alpha / r (alpha / sqrt(r) with rsLoRA), as PEFT's
``LoraLayer`` computes it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmc.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoRALayout
from llmc.runtime.lora.errors import LoRAAdapterError

CONFIG_FILE, WEIGHTS_FILE = ADAPTER_CONFIG, ADAPTER_WEIGHTS
_PREFIX = "base_model.model."
# Options of LoraConfig whose adapters compute something other than x A^T B^T * scaling.
_UNSUPPORTED = {
    "use_dora": "DoRA",
    "modules_to_save": "modules_to_save (whole trained modules)",
}


@dataclass(frozen=True)
class PeftAdapter:
    """A loaded adapter.

    Attributes:
        name: the name it is served under.
        path: its directory.
        weights: {module: (A^T [K, r] float32, (scaling * B)^T [r, O] float32)}: what a slot
            holds.
        rank: the largest r over its modules.
        base_model: ``base_model_name_or_path`` of its config (what it was trained on).
        digest: sha256 of its config and weights files (hex).
    """

    name: str
    path: Path
    weights: dict[str, tuple[np.ndarray, np.ndarray]]
    rank: int
    base_model: str | None
    digest: str

    @property
    def nbytes(self) -> int:
        """Bytes of its slot tensors."""
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_peft_adapter(name: str, path: str | Path, layout: LoRALayout) -> PeftAdapter:
    """Read the PEFT directory ``path`` as adapter ``name`` for an engine with ``layout``.

    Raises:
        LoRAAdapterError: no such directory or file, not a LoRA adapter, a LoraConfig option
            the slots cannot compute (DoRA, modules_to_save, biases), a module the engine has
            no slot for, a rank past ``layout.max_lora_rank``, or a weight whose shape is not
            the module's (an adapter of another model).
    """
    path = Path(path)
    config = _read_config(name, path)
    tensors = _read_weights(name, path)
    alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    alpha_pattern = config.get("alpha_pattern") or {}
    weights = {}
    for key in sorted(k for k in tensors if k.endswith(".lora_A.weight")):
        module = key[: -len(".lora_A.weight")].removeprefix(_PREFIX)
        a, b = tensors[key], tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise LoRAAdapterError(f"adapter {name!r}: {key} has no lora_B weight")
        _check_module(name, module, a, b, layout)
        r = a.shape[0]
        module_alpha = float(_pattern_value(alpha_pattern, module, alpha))
        scaling = module_alpha / (math.sqrt(r) if rslora else r)
        weights[module] = (
            np.ascontiguousarray(a.T, np.float32),
            np.ascontiguousarray((b * scaling).T, np.float32),
        )
    if not weights:
        raise LoRAAdapterError(f"adapter {name!r}: {path / WEIGHTS_FILE} holds no LoRA weight")
    return PeftAdapter(
        name=name,
        path=path,
        weights=weights,
        rank=max(a.shape[1] for a, _ in weights.values()),
        base_model=config.get("base_model_name_or_path"),
        digest=_digest(path),
    )


def _read_config(name: str, path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise LoRAAdapterError(f"adapter {name!r}: {file} not found (a PEFT adapter directory?)")
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoRAAdapterError(f"adapter {name!r}: {file} is not valid JSON ({e})") from e
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise LoRAAdapterError(f"adapter {name!r}: {file} is not a LoRA adapter's config")
    for option, what in _UNSUPPORTED.items():
        if config.get(option):
            raise LoRAAdapterError(f"adapter {name!r} uses {what}, which LoRA slots do not compute")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(f"adapter {name!r} trains biases (bias={config['bias']!r})")
    return config


def _read_weights(name: str, path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise LoRAAdapterError(f"adapter {name!r}: {file} not found (saved as safetensors?)")
    try:
        return {k: v.astype(np.float32) for k, v in load_file(file).items()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise LoRAAdapterError(f"adapter {name!r}: {file} cannot be read ({e})") from e


def _check_module(name: str, module: str, a: np.ndarray, b: np.ndarray, layout) -> None:
    if module not in layout.modules:
        raise LoRAAdapterError(
            f"adapter {name!r} adapts {module}, which the engine has no LoRA slot for (built "
            f"with --lora-target-modules {','.join(layout.target_modules)})"
        )
    k, o = layout.modules[module]
    r = a.shape[0]
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != k or b.shape != (o, r):
        raise LoRAAdapterError(
            f"adapter {name!r}: {module}'s lora_A {list(a.shape)} and lora_B {list(b.shape)} "
            f"do not fit the engine's [r, {k}] and [{o}, r]: an adapter of another model"
        )
    if r > layout.max_lora_rank:
        raise LoRAAdapterError(
            f"adapter {name!r} has rank {r} on {module}, past the engine's --max-lora-rank "
            f"{layout.max_lora_rank}; rebuild the engine with --max-lora-rank {r} or more"
        )


def _pattern_value(pattern: dict, module: str, default):
    """PEFT's ``alpha_pattern`` lookup: the value of the first key the module name ends with."""
    for key, value in pattern.items():
        if module == key or module.endswith(f".{key}"):
            return value
    return default


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        h.update((path / file).read_bytes())
    return h.hexdigest()
