"""What one ``llmc bench`` run sends, and where: `BenchConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llmc.errors import LlmcError

ENDPOINTS = ("completions", "chat")


class BenchConfigError(LlmcError):
    """A benchmark option is out of range or the options contradict each other."""


def _opt(default: object, help: str, **metadata: object) -> object:  # noqa: A002
    return field(default=default, metadata={"help": help, **metadata})


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One load-generation run against an OpenAI-compatible server (ours, vLLM, llama.cpp...).

    Prompts are either random (``input_len`` words drawn from a fixed English word list, or, with
    ``tokenizer``, exactly ``input_len`` token ids) or read from ``prompt_file``. Requests arrive
    as a Poisson process at ``request_rate`` per second (``inf``: all at once), at most
    ``max_concurrency`` in flight. The option names and meanings follow vLLM's
    ``vllm bench serve``.
    """

    base_url: str = _opt("http://127.0.0.1:8000", "server root URL (without /v1)")
    model: str | None = _opt(None, "model name to send; default: the first of GET /v1/models")
    api_key: str | None = _opt(None, "bearer token sent as Authorization header")
    endpoint: str = _opt(
        "completions", "API to load: /v1/completions or /v1/chat/completions", choices=ENDPOINTS
    )
    num_prompts: int = _opt(100, "number of requests to send")
    input_len: int = _opt(128, "random prompts: prompt length in words (tokens with --tokenizer)")
    output_len: int = _opt(128, "max_tokens of every request (file prompts may set their own)")
    range_ratio: float = _opt(
        0.0, "random prompts: input and output lengths uniform in [len*(1-r), len*(1+r)]"
    )
    prefix_len: int = _opt(0, "random prompts: a shared prefix of this many words/tokens")
    prompt_file: str | None = _opt(
        None, ".txt (one prompt per line) or .jsonl ({'prompt': str, 'output_len': int?}) file"
    )
    tokenizer: str | None = _opt(
        None,
        "Hugging Face tokenizer directory (an llmc engine directory works): random prompts get "
        "exactly --input-len tokens, sent as token ids on /v1/completions",
    )
    request_rate: float = _opt(
        math.inf, "mean requests per second, Poisson arrivals; inf: all at once"
    )
    max_concurrency: int | None = _opt(None, "most requests in flight at once; default: no limit")
    ignore_eos: bool = _opt(
        False,
        "ask the server to ignore EOS (vLLM's extension) so every "
        "request generates exactly its max_tokens",
    )
    temperature: float = _opt(0.0, "sampling temperature sent with every request")
    json_schema: str | None = _opt(
        None,
        "a JSON schema file: every request asks for output valid against it "
        "(response_format json_schema); measures constrained decoding",
    )
    seed: int = _opt(0, "seed of the prompts and arrival times")
    timeout_s: float = _opt(600.0, "per-request timeout, seconds")

    def validate(self) -> None:
        """Raises:
        BenchConfigError: naming the option that is out of range or contradicts another.
        """
        if self.endpoint not in ENDPOINTS:
            raise BenchConfigError(f"--endpoint must be one of {ENDPOINTS}, got {self.endpoint!r}")
        for name in ("num_prompts", "input_len", "output_len"):
            if getattr(self, name) < 1:
                raise BenchConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.prefix_len < 0:
            raise BenchConfigError("--prefix-len must be >= 0")
        if not 0.0 <= self.range_ratio < 1.0:
            raise BenchConfigError(f"--range-ratio must be in [0, 1), got {self.range_ratio}")
        if not self.request_rate > 0:
            raise BenchConfigError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise BenchConfigError("--max-concurrency must be >= 1")
        if self.timeout_s <= 0:
            raise BenchConfigError("--timeout-s must be > 0")
        if self.json_schema is not None and not Path(self.json_schema).is_file():
            raise BenchConfigError(f"--json-schema {self.json_schema}: no such file")
        if not self.base_url.startswith(("http://", "https://")):
            raise BenchConfigError(
                f"--base-url must start with http:// or https://, got {self.base_url!r}"
            )
