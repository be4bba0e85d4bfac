"""The adapters an engine serves: the names it knows, those loaded in host memory (an LRU of
``max_cpu_loras``) and those in its N slots (an LRU too), filled as each step needs them.

The scheduler admits no more distinct adapters into the running set than there are slots
(``Scheduler``'s ``max_loras``), so every step's adapters fit: ``slot_ids`` loads the ones not
in a slot into the slots no adapter of the step uses, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from llmc.engine.lora import NO_SLOT, LoRALayout, lora_a_name, lora_b_name
from llmc.runtime.lora.errors import LoRAAdapterError, LoRANotFoundError
from llmc.runtime.lora.lora_request import LoRARequest
from llmc.runtime.lora.peft_adapter import PeftAdapter, load_peft_adapter


class AdapterTable:
    """Adapters by name, and the slot tensors of a LoRA engine's runner.

    Args:
        layout: the engine's slots (``manifest.json``'s ``lora``).
        slots: the runner's slot tensors by input name (``OrtRunner.lora_slots``), written in
            place: A^T into ``lora_a.<m>`` columns ``s*R : s*R + r``, (scaling * B)^T into
            ``lora_b.<m>`` rows ``s*R : s*R + r``, zeros elsewhere in the slot.
        max_cpu_loras: adapters kept loaded in host memory (at least ``layout.max_loras``);
            one evicted is read again from its directory when next used.
    """

    def __init__(self, layout: LoRALayout, slots: dict[str, np.ndarray], max_cpu_loras: int):
        self.layout = layout
        self._slots = slots
        self.max_cpu_loras = max(max_cpu_loras, layout.max_loras)
        self._requests: dict[str, LoRARequest] = {}
        self._loaded: OrderedDict[str, PeftAdapter] = OrderedDict()
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # least recently used first

    def add(self, request: LoRARequest) -> PeftAdapter:
        """Know (and load) ``request``'s adapter; re-adding a name with the same path is a
        no-op. Raises LoRAAdapterError for an adapter the engine cannot serve (nothing is
        changed) or a name already used by another path."""
        known = self._requests.get(request.lora_name)
        if known is not None and known.lora_path != request.lora_path:
            raise LoRAAdapterError(
                f"adapter {request.lora_name!r} is already loaded from {known.lora_path}"
            )
        adapter = self._load(request)
        self._requests[request.lora_name] = request
        return adapter

    def remove(self, name: str) -> None:
        """Forget adapter ``name`` (its slot is zeroed). Raises LoRANotFoundError if unknown.
        The caller makes sure no unfinished request uses it."""
        if self._requests.pop(name, None) is None:
            raise LoRANotFoundError(f"no LoRA adapter named {name!r} is loaded")
        self._loaded.pop(name, None)
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._clear(slot)

    def __contains__(self, name: str) -> bool:
        return name in self._requests

    def requests(self) -> list[LoRARequest]:
        """The known adapters, in the order they were added."""
        return list(self._requests.values())

    def slot_ids(self, names: list[str | None], num_tokens: list[int]) -> np.ndarray:
        """[T] int64: each token's slot, sequence b's ``num_tokens[b]`` tokens under adapter
        ``names[b]`` (None: the base model, -1), after loading the step's adapters that are
        not in a slot. Raises RuntimeError if the step has more distinct adapters than slots
        (the scheduler prevents it), LoRANotFoundError for an unknown name."""
        wanted = list(dict.fromkeys(n for n in names if n is not None))
        if len(wanted) > self.layout.max_loras:
            raise RuntimeError(
                f"a step with {len(wanted)} adapters on an engine with {self.layout.max_loras} "
                "LoRA slots"
            )
        for name in wanted:
            self._place(name, wanted)
        per_seq = np.fromiter(
            (NO_SLOT if n is None else self._slot_of[n] for n in names), np.int64, len(names)
        )
        return np.repeat(per_seq, num_tokens)

    def _place(self, name: str, step: list[str]) -> None:
        """Put ``name`` in a slot (it is then the most recently used)."""
        if name in self._slot_of:
            self._slot_of.move_to_end(name)
            return
        if name not in self._requests:
            raise LoRANotFoundError(f"no LoRA adapter named {name!r} is loaded")
        used = set(self._slot_of.values())
        free = [s for s in range(self.layout.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(n for n in self._slot_of if n not in step)
            slot = self._slot_of.pop(victim)
        self._write(slot, self._load(self._requests[name]))
        self._slot_of[name] = slot

    def _load(self, request: LoRARequest) -> PeftAdapter:
        adapter = self._loaded.get(request.lora_name)
        if adapter is None:
            adapter = load_peft_adapter(request.lora_name, request.lora_path, self.layout)
            self._loaded[request.lora_name] = adapter
            while len(self._loaded) > self.max_cpu_loras:
                self._loaded.popitem(last=False)
        self._loaded.move_to_end(request.lora_name)
        return adapter

    def _write(self, slot: int, adapter: PeftAdapter) -> None:
        self._clear(slot)
        at = slot * self.layout.max_lora_rank
        for module, (a, b) in adapter.weights.items():
            r = a.shape[1]
            self._slots[lora_a_name(module)][:, at : at + r] = a
            self._slots[lora_b_name(module)][at : at + r, :] = b

    def _clear(self, slot: int) -> None:
        rank = self.layout.max_lora_rank
        cols = slice(slot * rank, (slot + 1) * rank)
        for module in self.layout.modules:
            self._slots[lora_a_name(module)][:, cols] = 0.0
            self._slots[lora_b_name(module)][cols, :] = 0.0


def adapter_table(loaded, max_cpu_loras: int | None) -> AdapterTable | None:
    """The adapter table of a loaded engine (``LoadedEngine``) built with ``--enable-lora``,
    over its runner's slot tensors; None for an engine without LoRA. Raises RuntimeError when
    the runner holds no slot tensors (a runner that cannot run LoRA engines)."""
    record = loaded.manifest.lora
    if not record:
        return None
    slots = getattr(loaded.runner, "lora_slots", None)
    if not slots:
        raise RuntimeError(
            f"the {type(loaded.runner).__name__} runs no LoRA engine; serve it on the CPU EP "
            "(--execution-provider cpu)"
        )
    layout = LoRALayout.from_dict(record)
    return AdapterTable(layout, slots, max_cpu_loras or layout.max_loras)
