"""How the engine speculates (vLLM's ``--speculative-config``): the method, the draft length and
the n-gram window, read from the same JSON keys as vLLM's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: Default ``disable_by_batch_size`` by method. Measured on Gemma 3 270M float32 (2-core AMD
#: EPYC, greedy, 128-token prompts and outputs, k = 4; benchmarks/RESULTS.md): against no
#: speculation, total throughput at 2/4/8/16 concurrent requests was 1.68/1.09/0.67/0.65x with
#: an int4 draft and 2.23/1.31/1.00/0.83x with n-gram lookup.
DISABLE_BY_BATCH_SIZE = {"draft": 4, "ngram": 8}

_KEYS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "model",
    "disable_by_batch_size",
)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
        method: ``"ngram"`` (prompt lookup: the tokens that followed the latest earlier
            occurrence of the sequence's last n tokens) or ``"draft"`` (a smaller or quantized
            engine of the same model, run greedily for ``num_speculative_tokens`` steps).
        num_speculative_tokens: k, the most tokens drafted per step and sequence (>= 1).
        prompt_lookup_max: n-gram: the longest suffix matched (tokens).
        prompt_lookup_min: n-gram: the shortest suffix matched (tokens, >= 1).
        model: draft: the draft engine directory; None takes the engine's own (``draft/``
            inside the engine directory).
        disable_by_batch_size: no speculation in a step with more running sequences than this;
            None takes the method's `DISABLE_BY_BATCH_SIZE`.
    """

    method: Literal["ngram", "draft"]
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f'speculative method must be "ngram" or "draft", got {self.method!r}')
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be an integer >= 1, got "
                f"{self.num_speculative_tokens!r}"
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(
                f"disable_by_batch_size must be at least 1, got {self.disable_by_batch_size}"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )

    @property
    def max_batch_size(self) -> int:
        """The most running sequences a speculating step may have."""
        if self.disable_by_batch_size is not None:
            return self.disable_by_batch_size
        return DISABLE_BY_BATCH_SIZE[self.method]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SpeculativeConfig:
        """The config of vLLM's JSON object (``{"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 4}``).

        Raises:
            ValueError: an unknown key, a missing ``method`` or ``num_speculative_tokens``, or a
                value out of range.
        """
        unknown = sorted(set(values) - set(_KEYS))
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}; known: {list(_KEYS)}")
        for key in ("method", "num_speculative_tokens"):
            if key not in values:
                raise ValueError(f"speculative_config needs {key!r}")
        return cls(**values)
