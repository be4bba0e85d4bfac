"""Exceptions llmc raises for users: each message says what was wrong and what to do."""


class LlmcError(Exception):
    """Base of every llmc error a user can act on (the CLI prints its message, no traceback)."""


class EngineError(LlmcError):
    """An engine directory cannot be used."""


class EngineNotFoundError(EngineError):
    """The engine directory, or its ``manifest.json``, does not exist."""


class EngineCorruptError(EngineError):
    """An engine file is unreadable, malformed, or differs from the digest in its manifest."""


class EngineMismatchError(EngineError):
    """The engine was built for another format, target, ISA or backend version than this host."""


class BuildConfigError(LlmcError):
    """A build option is unknown, out of range, or asks for a target this host cannot build."""


class ModelSourceError(LlmcError):
    """The model to build (path, GGUF file or alias) cannot be found or read."""


class EngineConfigError(LlmcError, ValueError):
    """Serving options that cannot work together (e.g. a KV pool smaller than one sequence)."""


class ContextLengthError(LlmcError, ValueError):
    """A request's prompt plus ``max_tokens`` is longer than the engine's ``max_model_len``.

    Attributes:
        limit: the engine's ``max_model_len`` in tokens.
        num_tokens: the request's prompt tokens plus ``max_tokens``.
    """

    def __init__(self, message: str, *, limit: int, num_tokens: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.num_tokens = num_tokens


class StepFailedError(LlmcError):
    """A model step raised (the runner, or sampling its logits). The requests it carried were
    aborted: their blocks are freed, and the blocks the step was to fill are out of the prefix
    cache. The engine's other requests are untouched and it can keep stepping; the failed
    requests may be submitted again. The original exception is the ``__cause__``.

    Attributes:
        request_ids: the aborted requests, in step order.
        in_runner: the runner itself raised (the model, its memory, its library), not the
            sampling or bookkeeping of the step's requests; only such failures say that the
            engine may be broken.
    """

    def __init__(
        self, message: str, *, request_ids: tuple[str, ...], in_runner: bool = False
    ) -> None:
        super().__init__(message)
        self.request_ids = request_ids
        self.in_runner = in_runner


class RegistryError(LlmcError):
    """The engine registry (local or remote) cannot do what was asked: unknown engine, bad URL."""


class NoMatchingEngineError(RegistryError):
    """No engine in the registry fits this host; the message lists each candidate and why."""


class BlobCorruptError(EngineCorruptError):
    """A registry blob's content differs from its sha256 digest (tampered or truncated)."""


class SignatureError(RegistryError):
    """An engine manifest's signature is missing, malformed, or does not verify with the key."""
