"""Text for calibration and for the accuracy report: a user's file, or text the model samples.

One file serves both without overlap: ``split_texts`` gives the calibration statistics the first
80% of it and keeps the last 20% as held-out text that the accuracy report scores (a report on the
calibration text itself would flatter the quantized model). With no file, the model samples its
own text (DESIGN §5), with one seed for calibration (``CALIBRATION_SEED``) and another for the
held-out text (``HELDOUT_SEED``).

Files are checked in ``read_texts``, before any model is loaded, so a bad file fails at once with
``CalibrationDataError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llmc.errors import LlmcError

CALIBRATION = "calibration"
HELDOUT = "heldout"
CALIBRATION_SEED = 0
HELDOUT_SEED = 1
#: Placed between texts when they are tokenized as one stream.
TEXT_SEPARATOR = "\n\n"
_SUFFIXES = (".txt", ".jsonl")
# Texts are tokenized in pieces of about this many characters, only as far as the windows need.
_PIECE_CHARS = 1 << 16
_FORMAT_HINT = 'give a UTF-8 .txt file, or a .jsonl file with one {"text": "..."} object per line'


class CalibrationDataError(LlmcError):
    """A calibration or held-out data file is missing, unreadable, malformed, empty, or too short
    for the windows asked of it."""


def read_texts(path: str | Path) -> list[str]:
    """Read the texts of a data file.

    ``.txt``: the whole file is one text. ``.jsonl``: one JSON object per line, each with a
    non-empty string field ``"text"``; blank lines are skipped.

    Raises:
        CalibrationDataError: the file is missing, a directory, unreadable, not UTF-8, empty or
            whitespace only, has another extension, or (jsonl) a line is not JSON or lacks a
            non-empty string "text" (the message gives the line number).
    """
    p = Path(path)
    where = f"calibration data {p}"
    if p.suffix.lower() not in _SUFFIXES:
        raise CalibrationDataError(f"{where}: unsupported file type {p.suffix!r}; {_FORMAT_HINT}")
    if not p.exists():
        raise CalibrationDataError(f"{where} does not exist; check the path")
    if not p.is_file():
        raise CalibrationDataError(f"{where} is not a file; {_FORMAT_HINT}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CalibrationDataError(f"{where} cannot be read: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CalibrationDataError(
            f"{where} is not UTF-8 text (invalid byte at offset {e.start}); {_FORMAT_HINT}"
        ) from e
    if p.suffix.lower() == ".txt":
        texts = [text] if text.strip() else []
    else:
        texts = _jsonl_texts(text, where)
    if not texts:
        raise CalibrationDataError(f"{where} is empty (no text in it); {_FORMAT_HINT}")
    return texts


def _jsonl_texts(text: str, where: str) -> list[str]:
    texts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CalibrationDataError(f"{where}, line {lineno}: not JSON ({e.msg})") from e
        value = record.get("text") if isinstance(record, dict) else None
        if not isinstance(value, str) or not value.strip():
            raise CalibrationDataError(
                f'{where}, line {lineno}: expected an object with a non-empty string "text" '
                f"field; {_FORMAT_HINT}"
            )
        texts.append(value)
    return texts


def split_texts(texts: list[str], part: str, heldout_fraction: float = 0.2) -> list[str]:
    """The ``part`` ("calibration" or "heldout") of ``texts``; the two parts never overlap.

    Several texts split by records: the last ``round(n * heldout_fraction)`` (at least one, and at
    least one left for calibration) are held out. A single text splits by characters: the last
    ``heldout_fraction`` of it is held out, cut at the first whitespace at or after that point
    (or the last one before it) so that no word is split in two.

    Raises:
        ValueError: ``part`` or ``heldout_fraction`` (must be in (0, 1)) is out of range.
        CalibrationDataError: no texts, or a single text too short to give both parts text.
    """
    if part not in (CALIBRATION, HELDOUT):
        raise ValueError(f"part must be {CALIBRATION!r} or {HELDOUT!r}, got {part!r}")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if not texts:
        raise CalibrationDataError("no texts to split into calibration and held-out parts")
    if len(texts) > 1:
        num_heldout = min(max(1, round(len(texts) * heldout_fraction)), len(texts) - 1)
        cut = len(texts) - num_heldout
        return list(texts[:cut] if part == CALIBRATION else texts[cut:])
    text = texts[0]
    cut = _whitespace_cut(text, int(len(text) * (1.0 - heldout_fraction)))
    calibration, heldout = text[:cut], text[cut:]
    if not calibration.strip() or not heldout.strip():
        raise CalibrationDataError(
            f"a text of {len(text)} characters is too short to split into calibration and "
            f"held-out parts; give more text"
        )
    return [calibration if part == CALIBRATION else heldout]


def _whitespace_cut(text: str, at: int) -> int:
    """The index of the first whitespace character at or after ``at``, else the last before it,
    else ``at`` (a text without whitespace is cut between characters)."""
    for i in range(at, len(text)):
        if text[i].isspace():
            return i
    for i in range(min(at, len(text)) - 1, 0, -1):
        if text[i].isspace():
            return i
    return at


def token_windows(texts: list[str], tokenizer, num_windows: int, seq_len: int) -> list[np.ndarray]:
    """Consecutive, non-overlapping windows of ``seq_len`` tokens over ``texts``.

    The texts are joined with ``TEXT_SEPARATOR`` and tokenized without special tokens (in pieces
    cut at whitespace, and only as far as the windows need). A window starts with the tokenizer's
    BOS id if it has one, followed by ``seq_len - 1`` text tokens (else ``seq_len`` text tokens),
    as a prompt would. Returns up to ``num_windows`` int64 arrays of shape [seq_len].

    Raises:
        ValueError: ``num_windows`` < 1 or ``seq_len`` < 2.
        CalibrationDataError: the text is too short for even one window (the message gives the
            number of tokens found and needed).
    """
    if num_windows < 1 or seq_len < 2:
        raise ValueError(f"need num_windows >= 1 and seq_len >= 2, got {num_windows}, {seq_len}")
    bos = tokenizer.bos_token_id
    per_window = seq_len - 1 if bos is not None else seq_len
    wanted = num_windows * per_window
    ids: list[int] = []
    for piece in _pieces(TEXT_SEPARATOR.join(texts)):
        ids += tokenizer.encode(piece, add_special_tokens=False)
        if len(ids) >= wanted:
            break
    count = min(num_windows, len(ids) // per_window)
    if count == 0:
        bos_note = " after the BOS token" if bos is not None else ""
        raise CalibrationDataError(
            f"the text has {len(ids)} tokens, but one window of {seq_len} tokens needs "
            f"{per_window}{bos_note}; give more text or a smaller sequence length"
        )
    prefix = [bos] if bos is not None else []
    return [
        np.array(prefix + ids[i * per_window : (i + 1) * per_window], dtype=np.int64)
        for i in range(count)
    ]


def _pieces(text: str, size: int = _PIECE_CHARS):
    """``text`` in consecutive pieces of about ``size`` characters, each cut before a run of
    whitespace where there is one. Byte-level BPE pre-tokenizers (GPT-2's regex) never join a
    word with the whitespace after it, so the pieces tokenize exactly as the whole text does;
    other tokenizers may differ in a token or two at each cut."""
    start = 0
    while start < len(text):
        end = len(text)
        if end - start > size:
            window = text[start : start + 2 * size]
            cut = _whitespace_cut(window, size)
            while cut > 1 and window[cut - 1].isspace():
                cut -= 1
            end = start + cut
        yield text[start:end]
        start = end


class TextSampler:
    """What writes the text a build calibrates on when it has no file: ``sample(num_texts,
    max_new_tokens, seed)`` returns ``num_texts`` decoded texts of ``max_new_tokens`` tokens,
    sampled from BOS (the same seed gives the same texts). ``HfTextSampler`` runs a
    transformers model; the compiler's ``EngineTextSampler`` runs the float graph in llmc's
    runtime. ``prefix_stable``: text ``i`` does not depend on how many are sampled at once (the
    first n of any larger request are the texts of a request for n)."""

    prefix_stable: bool = False

    @property
    def kind(self) -> str:
        """What samples (its class name): the text depends on it, and caches are keyed by it."""
        return type(self).__name__

    def sample(self, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
        """The sampled texts; see the class docstring."""
        raise NotImplementedError


class HfTextSampler(TextSampler):
    """``sample_texts`` over a transformers model and its tokenizer."""

    def __init__(self, hf_model, tokenizer) -> None:
        self.hf_model = hf_model
        self.tokenizer = tokenizer

    def sample(self, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
        """As ``sample_texts``."""
        return sample_texts(self.hf_model, self.tokenizer, num_texts, max_new_tokens, seed)


def sample_texts(hf_model, tokenizer, num_texts: int, max_new_tokens: int, seed: int) -> list[str]:
    """``num_texts`` texts of ``max_new_tokens`` tokens sampled from the model, from BOS.

    Pure ancestral sampling (temperature 1, no top-k/top-p truncation) so the text follows the
    model's own distribution; EOS is suppressed so every text has its full length. Sampling runs
    under ``torch.manual_seed(seed)`` with the global RNG state restored afterwards, so a seed
    gives the same texts every time. A model routed to llmc's paged attention (``load_model``)
    is switched to PyTorch SDPA attention for the call (paged attention needs step metadata) and
    switched back after. Special tokens are dropped from the decoded texts.

    Raises ValueError if the tokenizer has neither a BOS nor an EOS token to start from.
    """
    import torch

    start = tokenizer.bos_token_id
    if start is None:
        start = tokenizer.eos_token_id  # GPT-2 style tokenizers begin documents with EOS
    if start is None:
        raise ValueError("the tokenizer has no BOS or EOS token to start sampling from")
    attention = hf_model.config._attn_implementation
    if attention not in ("eager", "sdpa"):
        hf_model.set_attn_implementation("sdpa")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = hf_model.generate(
                torch.full((num_texts, 1), start, dtype=torch.long),
                attention_mask=torch.ones((num_texts, 1), dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                min_p=None,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=pad,
            )
    finally:
        if hf_model.config._attn_implementation != attention:
            hf_model.set_attn_implementation(attention)
    # out: [num_texts, 1 + max_new_tokens]
    return [tokenizer.decode(row[1:].tolist(), skip_special_tokens=True) for row in out]


def load_windows(
    part: str,
    data: str | Path | None,
    hf_model,
    tokenizer,
    num_windows: int,
    seq_len: int,
) -> tuple[list[np.ndarray], str]:
    """The token windows of one part ("calibration" or "heldout") and where they came from.

    With ``data`` (a .txt/.jsonl path) the windows come from that part of the file
    (``split_texts``); without, from text the model samples with the part's seed (``hf_model``
    is a transformers model or a ``TextSampler``)
    (``CALIBRATION_SEED`` or ``HELDOUT_SEED``), a little more than the windows need.
    The second value is the label recorded in the accuracy report: the file's absolute path, or
    ``"sampled from the model (seed N)"``.

    Raises CalibrationDataError (bad file, too little text) and ValueError (bad ``part``).
    """
    if data is not None:
        texts = split_texts(read_texts(data), part)
        label = str(Path(data).resolve())
    else:
        if part not in (CALIBRATION, HELDOUT):
            raise ValueError(f"part must be {CALIBRATION!r} or {HELDOUT!r}, got {part!r}")
        seed = CALIBRATION_SEED if part == CALIBRATION else HELDOUT_SEED
        # Decoding and re-tokenizing does not give back exactly the sampled tokens: keep slack.
        sampler = hf_model if isinstance(hf_model, TextSampler) else None
        sampler = sampler or HfTextSampler(hf_model, tokenizer)
        texts = sampler.sample(num_windows, seq_len + seq_len // 8, seed)
        label = sampled_label(seed)
    return token_windows(texts, tokenizer, num_windows, seq_len), label


def sampled_label(seed: int) -> str:
    """The ``data`` label of text sampled from the model with ``seed``."""
    return f"sampled from the model (seed {seed})"
