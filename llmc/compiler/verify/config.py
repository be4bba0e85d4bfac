"""The options of ``llmc verify`` (``VerifyConfig``), from which its flags are derived: kept
apart from ``verify.py`` so that building the CLI's parser loads neither torch nor ONNX."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmc.errors import LlmcError

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-3
DEFAULT_SEQ_LEN = 128


class VerifyError(LlmcError):
    """``llmc verify`` cannot run: a bad option, or the checkpoint differs from the engine's."""


def _opt(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class VerifyConfig:
    """Options of ``llmc verify`` (see each field's help)."""

    data: str | None = _opt(
        None,
        "held-out text file, .txt or .jsonl (its last fifth is scored); default: the file the "
        "build's report used if it still exists, else text sampled from the model",
    )
    model: str | None = _opt(
        None, "the checkpoint the engine was built from, if it moved (default: the manifest's)"
    )
    windows: int = _opt(8, "token windows to score (one prefill each)")
    seq_len: int | None = _opt(
        None, f"tokens per window (default: {DEFAULT_SEQ_LEN}, or the engine's max_seq_len if less)"
    )
    rtol: float = _opt(DEFAULT_RTOL, "Polygraphy relative tolerance; quantized engines need more")
    atol: float = _opt(DEFAULT_ATOL, "Polygraphy absolute tolerance; quantized engines need more")
    threads: int = _opt(2, "ONNX Runtime intra-op threads")

    def window_len(self, max_seq_len: int) -> int:
        """Tokens per window for an engine serving ``max_seq_len``; raises VerifyError naming a
        bad option."""
        for name in ("windows", "threads"):
            if getattr(self, name) < 1:
                raise VerifyError(f"--{name} must be >= 1")
        if not (self.rtol >= 0 and self.atol >= 0):
            raise VerifyError("--rtol and --atol must be >= 0")
        seq_len = self.seq_len if self.seq_len is not None else min(DEFAULT_SEQ_LEN, max_seq_len)
        if not 2 <= seq_len <= max_seq_len:
            raise VerifyError(f"--seq-len must be in [2, {max_seq_len}] (the engine's max_seq_len)")
        return seq_len
