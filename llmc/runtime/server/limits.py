"""The server's bounds on what one request may cost, and their check.

Each bound caps work that grows with a request field and that no other limit already bounds:
stop strings are searched in every choice's text after every token (count x length), each stop
token id is compared per sampled token, ``n`` multiplies decode steps and KV blocks, logprobs
sort the vocabulary per token, a structured-output constraint is compiled (its bytes, its
``choice`` strings and its counted repetitions). ``max_tokens`` is bounded by the engine's
``max_model_len`` (``context_length_exceeded``) and the prompt by the body cap and
``max_model_len``, so neither is here. A request over a bound gets a 400 naming the field, the
bound and the ``llmc serve`` flag that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from llmc.errors import EngineConfigError
from llmc.runtime.sampling_params import MAX_LOGPROBS
from llmc.runtime.server.errors import ApiError, bad_request
from llmc.runtime.server.protocol import SamplingFields
from llmc.runtime.structured.constraint_size import constraint_size
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams


def _limit(default: int, help: str) -> int:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RequestLimits:
    """Per-request bounds of the HTTP server; each field is an ``llmc serve`` flag of the same
    name (``--max-stop-strings`` ...). OpenAI allows 4 stop strings, ``n`` up to 128 and 20 top
    logprobs; vLLM bounds only logprobs (20). The defaults take any real client's stop list and
    cap ``n`` at 16: each choice is a sequence of its own in every decode step.

    Raises:
        EngineConfigError: a bound below 1, or ``max_logprobs`` above the sampler's 20.
    """

    max_n: int = _limit(16, "most choices per request (n, best_of)")
    max_stop_strings: int = _limit(16, "most stop strings per request")
    max_stop_string_chars: int = _limit(256, "longest stop string, characters")
    max_stop_token_ids: int = _limit(64, "most stop_token_ids per request")
    max_logprobs: int = _limit(
        MAX_LOGPROBS, f"most top logprobs per token (logprobs, top_logprobs), <= {MAX_LOGPROBS}"
    )
    # 4 MiB holds a 128k-token prompt as token ids (~7 bytes per id in JSON) or as text, with
    # room to spare, and stops a client from making the server buffer arbitrary amounts.
    max_request_body_bytes: int = _limit(4 << 20, "larger request bodies get 413, bytes")
    # A 40,000-string choice (about 400 KB) compiles in a fraction of a second off the engine
    # thread; the bounds stop what would take minutes (100,000 strings took 71 s as a grammar
    # row) or blow up llguidance's lexer (a{1000000}).
    max_constraint_bytes: int = _limit(
        1 << 20,
        "largest structured-output constraint (JSON schema, regex, grammar, choices; the "
        "tools' schemas), bytes",
    )
    max_choices: int = _limit(50_000, "most strings of a structured-output choice")
    max_regex_repeat: int = _limit(
        10_000,
        "largest counted repetition in a constraint's regexes and grammar (a{n}, {n,m}, ~ n)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineConfigError(f"{f.name} must be an integer >= 1, got {value!r}")
        if self.max_logprobs > MAX_LOGPROBS:
            raise EngineConfigError(
                f"max_logprobs must be at most {MAX_LOGPROBS} (the sampler's limit), "
                f"got {self.max_logprobs}"
            )

    def check(self, request: SamplingFields) -> None:
        """Check a validated completion or chat request against every bound.

        Raises:
            ApiError: 400 naming the field at fault and the bound.
        """
        stop, stop_ids = request.stop_list, request.stop_token_ids or []
        if request.n > self.max_n:
            raise _over("n", request.n, self.max_n, "max_n")
        if len(stop) > self.max_stop_strings:
            raise _over("stop", f"{len(stop)} strings", self.max_stop_strings, "max_stop_strings")
        longest = max(map(len, stop), default=0)
        if longest > self.max_stop_string_chars:
            got = f"a string of {longest} characters"
            raise _over("stop", got, self.max_stop_string_chars, "max_stop_string_chars")
        if len(stop_ids) > self.max_stop_token_ids:
            got = f"{len(stop_ids)} ids"
            raise _over("stop_token_ids", got, self.max_stop_token_ids, "max_stop_token_ids")
        name, value = request.LOGPROBS_FIELD, request.sampled_logprobs
        if value is not None and value > self.max_logprobs:
            raise _over(name, value, self.max_logprobs, "max_logprobs")

    def check_constraint(self, constraint: StructuredOutputsParams, name: str) -> None:
        """Check a request's structured-output constraint (set by its field ``name``:
        ``structured_outputs``, ``response_format``, ``tools``, ...) before it is compiled.

        Raises:
            ApiError: 400 naming ``name`` and the bound.
        """
        size = constraint_size(constraint)
        if size.num_bytes > self.max_constraint_bytes:
            got = f"a constraint of {size.num_bytes} bytes"
            raise _over(name, got, self.max_constraint_bytes, "max_constraint_bytes")
        if size.num_choices > self.max_choices:
            raise _over(name, f"{size.num_choices} choices", self.max_choices, "max_choices")
        if size.max_repeat > self.max_regex_repeat:
            got = f"a repetition of {size.max_repeat}"
            raise _over(name, got, self.max_regex_repeat, "max_regex_repeat")


def _over(name: str, got: object, limit: int, bound: str) -> ApiError:
    flag = "--" + bound.replace("_", "-")
    return bad_request(
        f"Invalid value for '{name}': got {got}, more than this server's limit of {limit} "
        f"({bound}, set by `llmc serve {flag}`).",
        name,
    )
