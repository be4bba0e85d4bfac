"""Grammar engines for structured outputs, measured: xgrammar against llguidance.

For a tokenizer (an engine's ``tokenizer/`` directory: Gemma 3's has a vocabulary of 262,144),
each library's set-up (tokenizer tables), the compile time of each JSON schema (cold: a new
compiler or matcher, no cache), and the per-step cost of the token mask: at every token of a
valid instance of the schema, fill the next-token bitmask and accept the token (what the sampler
does for a constrained row per decode step). Reported per library and schema: median and max
mask microseconds per step, compile milliseconds.

    pip install xgrammar  # llguidance is llmc's dependency; xgrammar is only measured here
    python benchmarks/bench_grammar.py --tokenizer /path/to/engine/tokenizer --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMAS = {
    "flat": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
        {"name": "Ada Lovelace", "age": 36},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "genre": {"enum": ["comedy", "tragedy", "history"]},
                "acts": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 5,
                    "items": {
                        "type": "object",
                        "properties": {
                            "number": {"type": "integer", "minimum": 1},
                            "scenes": {"type": "array", "items": {"type": "string"}},
                        },
                        "required": ["number", "scenes"],
                    },
                },
                "author": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "year": {"type": "integer"},
            },
            "required": ["title", "genre", "acts"],
        },
        {
            "title": "The Tempest",
            "genre": "comedy",
            "acts": [{"number": 1, "scenes": ["On a ship at sea", "The island"]}],
            "author": "William Shakespeare",
            "year": 1611,
        },
    ),
}


def _host() -> str:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{model}; {platform.python_version()}"


def _xgrammar(tokenizer, vocab_size: int, schema: dict, tokens: list[int]) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
    t2 = time.perf_counter()
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    steps = []
    for tok in tokens:
        s = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        ok = matcher.accept_token(tok)
        steps.append(time.perf_counter() - s)
        if not ok:
            raise RuntimeError(f"xgrammar refused token {tok}")
    return {"setup_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3, "steps_s": steps}


def _llguidance(tokenizer, vocab_size: int, schema: dict, tokens: list[int]) -> dict:
    import llguidance
    import llguidance.hf

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    matcher = llguidance.LLMatcher(lltok, grammar)
    if matcher.is_error():
        raise RuntimeError(matcher.get_error())
    t2 = time.perf_counter()
    words = (vocab_size + 31) // 32
    bitmask = np.zeros((1, words), np.int32)
    steps = []
    for tok in tokens:
        s = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        ok = matcher.consume_token(tok)
        steps.append(time.perf_counter() - s)
        if not ok:
            raise RuntimeError(f"llguidance refused token {tok}: {matcher.get_error()}")
    return {"setup_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3, "steps_s": steps}


def main() -> None:
    """Measure both libraries on every schema of ``SCHEMAS``; print a table (times in ms and
    us, the host named), optionally write it as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer directory")
    ap.add_argument(
        "--vocab-size", type=int, help="the model's logits width (default: tokenizer's)"
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab_size = args.vocab_size or len(tokenizer)
    print(f"host: {_host()}; vocabulary {vocab_size}")
    print("| library | schema | tokens | set-up ms | compile ms | mask p50 us | mask max us |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for schema_name, (schema, instance) in SCHEMAS.items():
        tokens = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        tokens.append(tokenizer.eos_token_id)
        for lib, fn in (("xgrammar", _xgrammar), ("llguidance", _llguidance)):
            r = fn(tokenizer, vocab_size, schema, tokens)
            steps_us = [s * 1e6 for s in r.pop("steps_s")]
            row = dict(library=lib, schema=schema_name, tokens=len(tokens), **r)
            row |= {"mask_p50_us": statistics.median(steps_us), "mask_max_us": max(steps_us)}
            results.append(row)
            print(
                f"| {lib} | {schema_name} | {len(tokens)} | {row['setup_ms']:.0f} | "
                f"{row['compile_ms']:.1f} | {row['mask_p50_us']:.0f} | {row['mask_max_us']:.0f} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"host": _host(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
