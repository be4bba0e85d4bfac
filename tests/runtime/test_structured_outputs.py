"""Structured outputs on the real tiny engine: the grammar holds whatever the random weights
prefer, so every sampled output (temperature 1.0) must match its constraint; unconstrained rows
batched beside constrained ones get the tokens they get alone; a bad constraint is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from llmc.runtime.errors import InvalidRequestError
from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from llmc.runtime.structured.grammar import apply_bitmask, apply_token_masks
from llmc.runtime.structured.grammar_compiler import GrammarCompiler
from llmc.runtime.structured.structured_outputs import StructuredOutputsParams as SO

NESTED = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 6},
        "genre": {"enum": ["comedy", "tragedy", "history"]},
        "acts": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "minimum": 1, "maximum": 5},
                    "end": {"type": "boolean"},
                },
                "required": ["n", "end"],
                "additionalProperties": False,
            },
        },
        "author": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
        "year": {"type": "integer", "minimum": 1500, "maximum": 1700},
    },
    "required": ["title", "genre", "acts"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_llama_engine: Path) -> LLM:
    return LLM(tiny_llama_engine, num_blocks=64)


def _sampled(llm: LLM, constraint: SO, count: int, max_tokens: int = 120, n: int = 1):
    params = [
        SamplingParams(
            n=n, temperature=1.0, seed=i, max_tokens=max_tokens, structured_outputs=constraint
        )
        for i in range(count)
    ]
    outs = llm.generate(["The king", "Enter"] * (count // 2) + ["To be"] * (count % 2), params)
    return [c for o in outs for c in o.outputs]


def test_fifty_sampled_outputs_validate_against_a_nested_schema(llm):
    completions = _sampled(llm, SO(json=NESTED), 50)
    assert {c.finish_reason for c in completions} == {"stop"}
    for c in completions:
        jsonschema.validate(json.loads(c.text), NESTED)
    assert len({c.text for c in completions}) > 10  # sampled, not one forced answer


def test_json_object_regex_choice_and_grammars_match(llm):
    for c in _sampled(llm, SO(json_object=True), 6, max_tokens=64):
        if c.finish_reason == "stop":  # an unbounded object may run out of tokens
            assert isinstance(json.loads(c.text), dict)
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for c in _sampled(llm, SO(regex=pattern), 8):
        assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), c.text
    choices = ("to be", "not to be", "that is the question")
    texts = {c.text for c in _sampled(llm, SO(choice=choices), 12)}
    assert texts <= set(choices) and len(texts) > 1
    lark = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,2}/'
    for c in _sampled(llm, SO(grammar=lark), 8):
        assert c.finish_reason == "stop" and re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", c.text)
    gbnf = 'root ::= "yes" | "no" | digit digit\ndigit ::= [0-9]'
    for c in _sampled(llm, SO(grammar=gbnf), 8):
        assert c.finish_reason == "stop" and re.fullmatch(r"yes|no|\d\d", c.text), c.text


def test_each_forked_completion_follows_its_own_grammar(llm):
    completions = _sampled(llm, SO(json=NESTED), 4, n=3)
    assert len(completions) == 12
    for c in completions:
        jsonschema.validate(json.loads(c.text), NESTED)


def test_max_tokens_cuts_a_constrained_output_with_finish_reason_length(llm):
    (c,) = _sampled(llm, SO(json=NESTED), 1, max_tokens=5)
    assert c.finish_reason == "length" and len(c.token_ids) == 5


def test_unconstrained_rows_beside_constrained_ones_are_unchanged(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate(["The king", "Enter"], greedy)
    constrained = SamplingParams(temperature=0, max_tokens=120, structured_outputs=SO(json=NESTED))
    mixed = llm.generate(["The king", "To be", "Enter"], [greedy, constrained, greedy])
    assert [o.outputs[0].token_ids for o in alone] == [
        mixed[0].outputs[0].token_ids,
        mixed[2].outputs[0].token_ids,
    ]
    jsonschema.validate(json.loads(mixed[1].outputs[0].text), NESTED)


@pytest.mark.parametrize(
    "constraint, reason",
    [
        (SO(json={"type": "object", "properties": {"a": {"type": "strin"}}}), "strin"),
        (SO(regex="[0-9"), "regex"),
        (SO(grammar="start: undefined_rule"), "undefined_rule"),
        (SO(json="{not json"), "not valid JSON"),
        (SO(), "exactly one"),
        (SO(regex="a", choice=("b",)), "exactly one"),
        (SO(choice=()), "non-empty"),
        # compiled by llguidance, then unusable at the first tokens: found by the probe
        (SO(regex="a{1000000}"), "too many expressions"),
        (SO(grammar='root ::= "a" root'), "Too many items"),
        (SO(json={"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}), "no output"),
    ],
)
def test_a_bad_constraint_is_refused_naming_the_field(llm, constraint, reason):
    with pytest.raises(InvalidRequestError, match=re.escape(reason)) as info:
        llm.generate(["x"], SamplingParams(structured_outputs=constraint))
    assert info.value.field == "structured_outputs"
    assert not llm.engine.has_unfinished_requests()


def test_masks_cover_the_whole_vocabulary_and_only_constrained_rows(tiny_tokenizer):
    """The bitmask's bit order: with the choice "a" only the token(s) spelling a prefix of "a"
    stay finite, in the constrained row only; the unconstrained row is untouched."""
    vocab_size = len(tiny_tokenizer)
    compiler = GrammarCompiler(tiny_tokenizer, vocab_size, [tiny_tokenizer.eos_token_id])

    logits = np.random.default_rng(0).normal(size=(2, vocab_size)).astype(np.float32)
    before = logits.copy()
    apply_token_masks(logits, [_Row(None), _Row(compiler.state(SO(choice=("a",))))])
    np.testing.assert_array_equal(logits[0], before[0])
    allowed = np.flatnonzero(np.isfinite(logits[1]))
    assert [tiny_tokenizer.decode([t]) for t in allowed] == ["a"]
    np.testing.assert_array_equal(logits[1, allowed], before[1, allowed])


class _Row:
    """A sequence as the sampler reads it: a grammar state and its greediness."""

    def __init__(self, grammar, greedy: bool = False):
        self.grammar = grammar
        self.params = SamplingParams(temperature=0.0 if greedy else 1.0)


def test_a_greedy_row_picks_the_argmax_of_its_masked_logits(tiny_tokenizer):
    """Greedy rows skip the mask when their argmax is allowed: the token is still the argmax
    of the fully masked row, at every step of a schema with structure and free strings, with
    logits that often prefer a forbidden token."""
    vocab_size = len(tiny_tokenizer)
    compiler = GrammarCompiler(tiny_tokenizer, vocab_size, [tiny_tokenizer.eos_token_id])
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
              "n": {"type": "integer"}}, "required": ["name", "n"]}  # fmt: skip
    rng = np.random.default_rng(1)
    words = np.empty((vocab_size + 31) // 32, np.int32)
    skipped = masked = 0
    for trial in range(6):
        state = compiler.state(SO(json=schema))
        for _ in range(40):
            if state.is_stopped:
                break
            logits = rng.normal(size=(1, vocab_size)).astype(np.float32)
            logits[0, rng.integers(vocab_size)] += 3.0 * (trial % 2)  # a strong favourite
            reference = logits.copy()
            state.fill_bitmask(words)
            apply_bitmask(reference[0], words)
            fast = logits.copy()
            apply_token_masks(fast, [_Row(state, greedy=True)])
            skipped += bool(np.isfinite(fast).all())
            masked += not np.isfinite(fast).all()
            token = int(fast[0].argmax())
            assert token == int(reference[0].argmax())
            state.accept(token)
    assert skipped and masked  # both paths ran


def test_llmc_generate_json_schema(tiny_llama_engine, tmp_path, capsys):
    from llmc.cli import main

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"enum": ["x", "y"]},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    args = ["generate", str(tiny_llama_engine), "Hello", "The king", "--json-schema", str(path)]
    assert main([*args, "--temperature", "1", "--seed", "5", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert line["finish_reason"] == "stop"
        jsonschema.validate(json.loads(line["text"]), schema)
    path.write_text('{"type": "strin"}')
    assert main(args) == 2
    assert "structured_outputs.json cannot be compiled" in capsys.readouterr().err


@pytest.mark.parametrize("density", [0.0, 1e-3, 0.3, 0.7, 0.999, 1.0])
@pytest.mark.parametrize("vocab_size", [512, 1000])
def test_apply_bitmask_equals_the_mask_it_encodes(density, vocab_size):
    """Both branches (few allowed, few forbidden), a vocabulary not a multiple of 32."""
    rng = np.random.default_rng(int(density * 1000) + vocab_size)
    allowed = rng.random(vocab_size) < density
    bits = np.zeros(-(-vocab_size // 32) * 32, np.bool_)
    bits[:vocab_size] = allowed
    words = np.packbits(bits, bitorder="little").view(np.int32)
    row = rng.normal(size=vocab_size).astype(np.float32)
    expected = np.where(allowed, row, -np.inf).astype(np.float32)
    apply_bitmask(row, words)
    np.testing.assert_array_equal(row, expected)


def test_a_constraint_failing_mid_generation_ends_its_own_completion(llm):
    """Ten free letters, then an endless forced run: it passes the compile-time probe and
    fails in llguidance at about the tenth token. Its completion ends with finish_reason
    "error" and the reason; the request batched beside it is unchanged; the engine goes on."""
    late = SO(grammar='start: c c c c c c c c c c tail\nc: "x" | "z"\ntail: "a" tail\n')
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate(["The king"], plain)[0].outputs[0].token_ids
    bad = SamplingParams(temperature=0, max_tokens=40, structured_outputs=late)
    failed, beside = llm.generate(["Enter", "The king"], [bad, plain])
    completion = failed.outputs[0]
    assert completion.finish_reason == "error"
    assert "Too many items" in completion.error and "<state>" not in completion.error
    assert set(completion.text[:9]) <= {"x", "z"} and len(completion.token_ids) < 40
    assert beside.outputs[0].token_ids == alone
    assert not llm.engine.has_unfinished_requests()
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("choices", [("a.b", "c-d", "(x)*", "e\\f"), ("a|b", "c.d", "[z]")])
def test_a_choice_matches_its_strings_literally(tiny_tokenizer, choices):
    """Choices compile to one escaped regex alternation: each string, regex characters and
    ``|`` included, is accepted as written, and nothing else (``a.b`` does not admit
    ``axb``)."""
    compiler = GrammarCompiler(tiny_tokenizer, len(tiny_tokenizer), [tiny_tokenizer.eos_token_id])

    def accepts(text: str) -> bool:
        state = compiler.state(SO(choice=choices))
        for token in tiny_tokenizer.encode(text, add_special_tokens=False):
            state.accept(token)
        return state.error is None and state.is_stopped

    assert all(accepts(c) for c in choices)
    assert not accepts(choices[0].replace(".", "x").replace("|", "x"))
