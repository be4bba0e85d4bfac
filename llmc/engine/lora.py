"""LoRA adapter slots in an engine graph: the contract between the build that reserves them and
the runtime that fills them (``llmc build --enable-lora``).

A LoRA engine has, besides ``STEP_INPUTS`` and the caches, one input ``lora_slot_ids`` [T] int64
(the slot of each packed token's adapter, -1 for the base model) and per target module ``m``
two inputs of the compute dtype (float32 on cpu): ``lora_a.<m>`` [K, N * R] and ``lora_b.<m>``
[N * R, O], N slots of rank R.
Slot s holds adapter A^T in columns ``s*R : s*R + r`` of ``lora_a`` and (scaling * B)^T in rows
``s*R : s*R + r`` of ``lora_b`` (zeros past its rank r). The graph adds to the module's output
``Y = X W``::

    Y + ((X @ lora_a).reshape(T, N, R) * onehot(lora_slot_ids, N)[:, :, None]).reshape(T, N*R)
        @ lora_b

so each token meets its own adapter only (Punica's segmented gather-matmul, as two dense
MatMuls over all slots: N * R is small beside K and O). A token of slot -1 gets exactly ``Y``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The per-token slot input of a LoRA engine ([T] int64; -1: no adapter).
LORA_SLOT_IDS = "lora_slot_ids"
#: The slot index of a token served by the base model.
NO_SLOT = -1


#: Where an engine directory keeps the adapters stored with it: ``lora/<name>/`` holding PEFT's
#: two files (``llmc lora add``; the registry signs and ships them with the engine).
ADAPTERS_DIR = "lora"
#: PEFT's files of an adapter: its LoraConfig and its weights.
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
#: What an adapter's name may hold (a registry path part and a ``model`` value).
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def stored_adapters(engine_dir: str | Path) -> dict[str, Path]:
    """The adapters stored with an engine: {name: its directory under ``lora/``}, sorted by
    name; {} when there is none."""
    root = Path(engine_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return {}
    return {d.name: d for d in sorted(root.iterdir()) if d.is_dir()}


def lora_a_name(module: str) -> str:
    """Graph input of ``module``'s stacked A slots, [K, N * R] float32."""
    return f"lora_a.{module}"


def lora_b_name(module: str) -> str:
    """Graph input of ``module``'s stacked, scaled B slots, [N * R, O] float32."""
    return f"lora_b.{module}"


def is_lora_input(name: str) -> bool:
    """``name`` is one of a LoRA engine's slot inputs (``lora_slot_ids``, ``lora_a.*``,
    ``lora_b.*``)."""
    return name == LORA_SLOT_IDS or name.startswith(("lora_a.", "lora_b."))


@dataclass(frozen=True)
class LoRALayout:
    """The adapter slots an engine reserves (``manifest.json``'s ``lora``).

    Attributes:
        max_loras: N, adapter slots: the most distinct adapters in one step.
        max_lora_rank: R, the largest rank a slot holds.
        target_modules: the module names adapters may target (``q_proj``, ``o_proj``, ...),
            matched against the last part of a checkpoint module name, as PEFT matches them.
        modules: {checkpoint module name: (K, O)} of each Linear given slots, in graph order.
    """

    max_loras: int
    max_lora_rank: int
    target_modules: tuple[str, ...]
    modules: dict[str, tuple[int, int]]

    @property
    def slot_width(self) -> int:
        """N * R, the columns of ``lora_a`` and rows of ``lora_b``."""
        return self.max_loras * self.max_lora_rank

    def input_names(self) -> list[str]:
        """The graph's LoRA inputs in order: ``lora_slot_ids``, then A and B per module."""
        names = [LORA_SLOT_IDS]
        for module in self.modules:
            names += [lora_a_name(module), lora_b_name(module)]
        return names

    def to_dict(self, dtype: str = "float32") -> dict:
        """The manifest's record (JSON types); ``dtype``: the slot tensors' (float32 on cpu,
        the compute dtype of a GPU engine)."""
        return {
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank,
            "target_modules": list(self.target_modules),
            "dtype": dtype,
            "modules": {m: list(shape) for m, shape in self.modules.items()},
        }

    @classmethod
    def from_dict(cls, record: dict) -> LoRALayout:
        """The layout a manifest records (``to_dict``). Raises KeyError or TypeError for a
        record that is not one."""
        return cls(
            max_loras=int(record["max_loras"]),
            max_lora_rank=int(record["max_lora_rank"]),
            target_modules=tuple(record["target_modules"]),
            modules={m: (int(k), int(o)) for m, (k, o) in record["modules"].items()},
        )


def layout_of_graph(
    max_loras: int, max_lora_rank: int, target_modules: tuple[str, ...], inputs
) -> LoRALayout | None:
    """The layout of an engine graph whose inputs are ``inputs`` ((name, shape) pairs, in
    graph order): its modules and their (K, O) read from the ``lora_a``/``lora_b`` inputs;
    None when it has no LoRA input."""
    shapes = dict(inputs)
    modules = {
        name[len("lora_a.") :]: (int(shape[0]), int(shapes[lora_b_name(name[len("lora_a.") :])][1]))
        for name, shape in inputs
        if name.startswith("lora_a.")
    }
    if not modules:
        return None
    return LoRALayout(max_loras, max_lora_rank, tuple(target_modules), modules)
