"""Benchmark prompts: random (words or exact token ids) or read from a file.

A server's tokenizer is not reachable through the OpenAI API, so random prompts are words drawn
from a fixed list of common English words (one word is one or a few tokens in most vocabularies;
the server's ``usage.prompt_tokens`` gives the true count). Given a local tokenizer, a prompt is
those words tokenized and cut to exactly ``input_len`` token ids, which ``/v1/completions``
accepts as ``prompt`` (OpenAI's API allows a list of token ids) - exact counts, no tokenizer
round trip. Lengths vary uniformly in ``[len*(1-r), len*(1+r)]`` as vLLM's random dataset does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmc.bench.config import BenchConfig, BenchConfigError

WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship town "
    "road arm difference value building action model season society tax director position "
    "player record paper space ground form event official matter center couple site project "
    "activity star table need court oil situation cost industry figure street image phone data "
    "picture practice piece land product doctor wall patient worker news test movie north love "
    "support technology step baby computer type attention film tree source organization hair "
    "window evidence population truth song bank river stone garden letter energy island bridge"
).split()


@dataclass(frozen=True)
class BenchRequest:
    """One request to send.

    Attributes:
        prompt: text, or token ids (``/v1/completions`` only).
        prompt_len: prompt length in tokens when known exactly (token ids), else the number of
            words or None (file prompts); the server's ``usage`` gives the true count.
        output_len: ``max_tokens``.
        disconnect_after: close the stream after this many content chunks (a client that hangs
            up); None: read to the end.
        model: the ``model`` field of this request (a LoRA adapter's name); None: the
            target's.
    """

    prompt: str | list[int]
    prompt_len: int | None
    output_len: int
    disconnect_after: int | None = None
    model: str | None = None


def _lengths(rng: random.Random, length: int, ratio: float, n: int) -> list[int]:
    lo, hi = max(1, int(length * (1 - ratio))), int(length * (1 + ratio))
    return [rng.randint(lo, hi) for _ in range(n)]


def load_tokenizer(path: str) -> Any:
    """The Hugging Face tokenizer saved in ``path`` (a model or llmc engine directory).

    Raises:
        BenchConfigError: if no tokenizer can be loaded from ``path``.
    """
    from transformers import AutoTokenizer

    engine_tokenizer = Path(path) / "tokenizer"  # an llmc engine keeps it in a subdirectory
    if (Path(path) / "manifest.json").is_file() and engine_tokenizer.is_dir():
        path = str(engine_tokenizer)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise BenchConfigError(
            f"--tokenizer {path!r}: no Hugging Face tokenizer there ({exc}); give a model or "
            "engine directory holding tokenizer.json, or drop --tokenizer to send random words"
        ) from exc


def random_requests(config: BenchConfig, tokenizer: Any | None = None) -> list[BenchRequest]:
    """``num_prompts`` random prompts: ``prefix_len`` shared words/tokens, then random ones.

    With ``tokenizer``: the completions endpoint gets exactly ``prefix_len + input_len`` token
    ids per prompt; the chat endpoint gets those ids decoded to text (re-tokenizing the text
    may give a slightly different count). Deterministic in ``config.seed``.
    """
    rng = random.Random(config.seed)
    n = config.num_prompts
    in_lens = _lengths(rng, config.input_len, config.range_ratio, n)
    out_lens = _lengths(rng, config.output_len, config.range_ratio, n)

    def words(count: int) -> list[str]:
        return [rng.choice(WORDS) for _ in range(count)]

    if tokenizer is None:
        prefix = words(config.prefix_len)
        return [
            BenchRequest(" ".join(prefix + words(k)), config.prefix_len + k, m)
            for k, m in zip(in_lens, out_lens, strict=True)
        ]

    def token_ids(count: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < count:  # a word is at least one token: 2*count words are enough
            ids += tokenizer.encode(" " + " ".join(words(2 * count)), add_special_tokens=False)
        return ids[:count]

    prefix_ids = token_ids(config.prefix_len) if config.prefix_len else []
    requests = []
    for k, m in zip(in_lens, out_lens, strict=True):
        ids = prefix_ids + token_ids(k)
        prompt: str | list[int] = ids if config.endpoint == "completions" else tokenizer.decode(ids)
        requests.append(BenchRequest(prompt, len(ids), m))
    return requests


def file_requests(config: BenchConfig) -> list[BenchRequest]:
    """``num_prompts`` requests from ``config.prompt_file``, cycling through it in order.

    ``.txt``: one prompt per non-empty line. ``.jsonl``: one object per line with ``prompt``
    (str) and optionally ``output_len`` (int; default ``config.output_len``).

    Raises:
        BenchConfigError: if the file is missing, empty, or a line is malformed.
    """
    path = Path(str(config.prompt_file))
    if not path.is_file():
        raise BenchConfigError(f"--prompt-file {path}: no such file")
    entries: list[tuple[str, int]] = []
    for num, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            entries.append((line, config.output_len))
            continue
        try:
            obj = json.loads(line)
            prompt, out = obj["prompt"], obj.get("output_len", config.output_len)
            if not isinstance(prompt, str) or not isinstance(out, int) or out < 1:
                raise TypeError("prompt must be a string and output_len an int >= 1")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise BenchConfigError(
                f'--prompt-file {path} line {num}: expected {{"prompt": str, '
                f'"output_len": int (optional)}}: {exc}'
            ) from exc
        entries.append((prompt, out))
    if not entries:
        raise BenchConfigError(f"--prompt-file {path} holds no prompt")
    return [
        BenchRequest(entries[i % len(entries)][0], None, entries[i % len(entries)][1])
        for i in range(config.num_prompts)
    ]


def make_requests(config: BenchConfig) -> list[BenchRequest]:
    """The requests of a run: from ``prompt_file`` if set, else random (see the module doc)."""
    if config.prompt_file is not None:
        return file_requests(config)
    tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    return random_requests(config, tokenizer)
