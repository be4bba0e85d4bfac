"""How one request is decoded: the user-facing knobs of the sampler and the stop conditions."""

from __future__ import annotations

from dataclasses import dataclass, field

# Temperatures below this are treated as greedy: dividing logits by ~0 overflows float32 (vLLM's
# `_SAMPLING_EPS` does the same).
GREEDY_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """Sampling and stopping parameters of one request (the subset of vLLM's we support).

    Attributes:
        n: number of completions per prompt; only 1 is supported for now.
        temperature: softmax temperature; 0 (or below 1e-5) means greedy (argmax).
        top_p: nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text
            Degeneration"): sample from the smallest set of tokens whose probability mass reaches
            ``top_p``. In (0, 1]; 1 disables it.
        top_k: sample from the ``top_k`` most likely tokens; None disables it.
        seed: seed of the request's own random generator, so its samples do not depend on what
            else is in the batch; None draws from the engine's generator.
        max_tokens: maximum number of generated tokens.
        stop: strings that end generation when they appear in the output text; the text is cut
            before the stop string. A single string is accepted and wrapped in a list.
        stop_token_ids: token ids that end generation (the token is kept in ``token_ids``).
        ignore_eos: keep generating after the model's EOS token(s).
        skip_special_tokens: leave special tokens (BOS, EOS, chat markers) out of the text.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax (temperature 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate(self) -> None:
        """Check every field.

        Raises:
            ValueError: naming the first bad field, its value and the allowed range.
        """
        if self.n != 1:
            raise ValueError(f"n > 1 is not supported yet (got n={self.n})")
        if not self.temperature >= 0.0:  # written so that NaN fails too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None (disabled) or an integer >= 1, got {self.top_k}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be None or an integer, got {self.seed!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be integers >= 0, got {t!r}")
