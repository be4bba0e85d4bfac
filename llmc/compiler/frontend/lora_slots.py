"""Give a transformers model's Linear layers LoRA adapter slots before export
(``llmc build --enable-lora``; the graph form is ``llmc.engine.lora``'s).

Each target ``nn.Linear`` gets a ``LoRASlotHook``, which adds the slots' delta to the base
projection. The slot tensors and the per-token slot mask are inputs of the packed model, handed
to every hook through one shared ``LoRAStepTensors`` for the duration of a forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmc.engine.lora import LoRALayout


@dataclass
class LoRAStepTensors:
    """What the hooks read during one forward: the slot mask [T, N] (1.0 where a token's
    adapter is the slot, 0.0 elsewhere) and each module's (A [K, N*R], B [N*R, O]) float32."""

    mask: torch.Tensor | None = None
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    hooks: list = field(default_factory=list)  # the hooks' handles (``detach``)

    def detach(self) -> None:
        """Remove the hooks: the model is as it was before ``attach_lora_slots``."""
        for handle in self.hooks:
            handle.remove()
        self.hooks.clear()


class LoRASlotHook:
    """A forward hook of one target ``nn.Linear`` that adds its slots' delta to the output:
    ``y + ((x @ A).reshape(..., N, R) * mask[..., None]).reshape(..., N*R) @ B``, ``x``
    [1, T, K]. A hook rather than a wrapper module: the Linear keeps its name, so its export,
    module name and quantization are those of an engine without LoRA."""

    def __init__(self, module: str, layout: LoRALayout, step: LoRAStepTensors):
        self.module, self.step = module, step
        self.num_slots, self.rank = layout.max_loras, layout.max_lora_rank

    def __call__(self, linear, args, y: torch.Tensor) -> torch.Tensor:
        (x,) = args
        a, b = self.step.weights[self.module]
        xa = (x @ a.to(x.dtype)).unflatten(-1, (self.num_slots, self.rank))
        xa = (xa * self.step.mask.to(x.dtype)[..., None]).flatten(-2)
        return y + xa @ b.to(x.dtype)


def attach_lora_slots(
    model: torch.nn.Module, max_loras: int, max_lora_rank: int, target_modules: tuple[str, ...]
) -> tuple[LoRALayout, LoRAStepTensors]:
    """Hook every ``nn.Linear`` of ``model``'s decoder layers whose last name part is in
    ``target_modules``; returns the layout (modules in model order, named as in the checkpoint)
    and the hooks' shared step tensors (``detach`` removes the hooks). Raises ValueError when
    no module matches."""
    step = LoRAStepTensors()
    found = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
        and name.rsplit(".", 1)[-1] in target_modules
        and ".layers." in f".{name}"
    ]
    if not found:
        raise ValueError(f"no Linear layer of the model is named one of {list(target_modules)}")
    modules = {name: (m.in_features, m.out_features) for name, m in found}
    layout = LoRALayout(max_loras, max_lora_rank, tuple(target_modules), modules)
    for name, m in found:
        step.hooks.append(m.register_forward_hook(LoRASlotHook(name, layout, step)))
    return layout, step


def slot_mask(slot_ids: torch.Tensor, num_slots: int) -> torch.Tensor:
    """[T, N] float32: 1.0 where token t's slot is n; a token of slot -1 has none."""
    return (slot_ids[:, None] == torch.arange(num_slots, device=slot_ids.device)).float()
