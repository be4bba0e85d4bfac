"""How one request is decoded: the user-facing knobs of the sampler and the stop conditions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams

# Temperatures below this are treated as greedy: dividing logits by ~0 overflows float32 (vLLM's
# `_SAMPLING_EPS` does the same).
GREEDY_TEMPERATURE = 1e-5

#: Most top logprobs a request may ask for per token (OpenAI allows 20 for chat; vLLM defaults 20).
MAX_LOGPROBS = 20

#: Largest seed: seeds are unsigned 64-bit integers, the range ``torch.Generator.manual_seed``
#: and numpy's generators both accept (torch also takes negative ones; numpy does not).
MAX_SEED = 2**64 - 1


@dataclass
class SamplingParams:
    """Sampling and stopping parameters of one request (vLLM's names and meanings).

    Order of the logits processing (vLLM v1's sampler): min_tokens masks the stop tokens, then the
    repetition, frequency and presence penalties, then greedy argmax or temperature, min_p,
    top_k and top_p. Logprobs are those of the raw model output (before any of it).

    Attributes:
        n: number of completions per prompt; they share the prompt's KV blocks.
        temperature: softmax temperature; 0 (or below 1e-5) means greedy (argmax).
        top_p: nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text
            Degeneration"): sample from the smallest set of tokens whose probability mass reaches
            ``top_p``. In (0, 1]; 1 disables it.
        top_k: sample from the ``top_k`` most likely tokens; None disables it.
        min_p: drop tokens whose probability is below ``min_p`` times the most likely one's
            (Nguyen et al. 2024, "Min P Sampling"). In [0, 1]; 0 disables it.
        seed: seed of the request's own random generator, so its samples do not depend on what
            else is in the batch; completion i of n > 1 uses ``(seed + i) mod 2**64``
            (`completion_seed`). In [0, 2**64 - 1]; None draws from the engine's generator.
        max_tokens: maximum number of generated tokens.
        min_tokens: EOS and ``stop_token_ids`` are suppressed (and stop strings not searched)
            until this many tokens have been generated.
        stop: strings that end generation when they appear in the output text; the text is cut
            before the stop string. A single string is accepted and wrapped in a list.
        stop_token_ids: token ids that end generation (the token is kept in ``token_ids``).
        include_stop_str_in_output: keep the stop string at the end of the text.
        ignore_eos: keep generating after the model's EOS token(s).
        presence_penalty: subtracted from the logit of every token generated at least once
            (OpenAI's definition). In [-2, 2]; 0 disables it.
        frequency_penalty: times the number of times a token was generated, subtracted from its
            logit (OpenAI's definition). In [-2, 2]; 0 disables it.
        repetition_penalty: for tokens of the prompt or the output, a positive logit is divided
            by it and a negative one multiplied (Keskar et al. 2019, CTRL). > 0; 1 disables it.
        logprobs: number of top logprobs returned per generated token (the sampled token's is
            always included); None returns none. In [0, 20].
        prompt_logprobs: number of top logprobs returned per prompt token (besides the prompt
            token's own); None returns none. Such prompts skip the prefix cache.
        skip_special_tokens: leave special tokens (BOS, EOS, chat markers) out of the text.
        structured_outputs: a constraint the output must match (a JSON schema, a regex, a
            choice, a grammar: `StructuredOutputsParams`), enforced by masking the logits
            (``grammar.py``); when ``max_tokens`` cuts it off, the finish reason is "length".
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def is_greedy(self) -> bool:
        """True when the sampler takes the argmax (temperature 0)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        """True when a presence, frequency or repetition penalty changes the logits."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def completion_seed(self, index: int) -> int | None:
        """The seed of completion ``index`` (0..n-1): ``seed + index`` as in vLLM, wrapped
        modulo 2**64 so that it stays a valid seed (``seed = 2**64 - 1`` gives completion 1
        seed 0); None when the request has no seed."""
        if self.seed is None:
            return None
        return (self.seed + index) % (MAX_SEED + 1)

    def validate(self) -> None:
        """Check every field.

        Raises:
            InvalidRequestError: (a ValueError) naming the first bad field (its ``field``), its
                value and the allowed range.
        """
        _check_int("n", self.n, 1)
        if not self.temperature >= 0.0 or math.isinf(self.temperature):  # NaN fails too
            raise InvalidRequestError(
                f"temperature must be a finite number >= 0, got {self.temperature}", "temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k is not None:
            _check_int("top_k", self.top_k, 1, "None (disabled) or ")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if self.seed is not None:
            check_seed(self.seed)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})",
                "min_tokens",
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError(
                    f"stop strings must be non-empty strings, got {s!r}", "stop"
                )
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, 0, "a list of ")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value}", name)
        if not 0.0 < self.repetition_penalty < math.inf:
            raise InvalidRequestError(
                f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}",
                "repetition_penalty",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, 0, "None or ")
                if value > MAX_LOGPROBS:
                    raise InvalidRequestError(
                        f"{name} must be at most {MAX_LOGPROBS}, got {value}", name
                    )
        if self.structured_outputs is not None:
            self.structured_outputs.validate()


def check_seed(seed: object, name: str = "seed") -> None:
    """Raise InvalidRequestError (a ValueError), naming ``name``, unless ``seed`` is an int in
    [0, `MAX_SEED`]."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InvalidRequestError(
            f"{name} must be None or an integer in [0, 2**64 - 1], got {seed!r}", name
        )


def _check_int(name: str, value: object, low: int | None, prefix: str = "") -> None:
    """Raise InvalidRequestError naming ``name`` unless ``value`` is an int (not a bool) >=
    ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        bound = f" >= {low}" if low is not None else ""
        raise InvalidRequestError(f"{name} must be {prefix}an integer{bound}, got {value!r}", name)
