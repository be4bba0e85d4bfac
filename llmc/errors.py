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
