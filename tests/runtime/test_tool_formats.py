"""Native tool syntaxes (``tool_format.py``): detection from the chat template, the prompt the
template renders, the calls parsed from an answer, and through the real server on tiny engines
whose templates render tools in the Hermes and Llama 3 syntaxes (random weights: under
``tool_choice="required"`` the grammar makes every call parse and validate)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import openai
import pytest
from pydantic import ValidationError

from llmc.runtime.server.chat_messages import ChatMessage, template_messages
from llmc.runtime.server.tool_calls import plan_tools
from llmc.runtime.server.tool_format import ToolFormat, detect_tool_format
from llmc.runtime.server.tool_protocol import ToolDefinition
from tests.tiny_models import CHAT_TEMPLATE

if TYPE_CHECKING:
    from tests.conftest import LiveServer, ServerFactory

# Templates written for these tests in the two families' syntaxes (tools in the system turn, a
# call per <tool_call> block / one {"name", "parameters"} object, results as their own turns),
# over the tiny tokenizer's role tokens.
HERMES_TEMPLATE = (
    "{%- if tools %}<|system|>{% if messages[0].role == 'system' %}{{ messages[0].content }}\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'For each call answer <tool_call>\n{"name": <name>, "arguments": <object>}\n</tool_call>'
    "<|end|>{% elif messages[0].role == 'system' %}<|system|>{{ messages[0].content }}<|end|>"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}<|user|><tool_response>\n{{ m.content }}\n</tool_response><|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|assistant|>{{ m.content or '' }}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|end|>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>Answer a function call as JSON "
    '{"name": function name, "parameters": dictionary of argument name and its value}.'
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|eot_id|>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>"
    '{"name": "{{ m.tool_calls[0].function.name }}", "parameters": '
    "{{ m.tool_calls[0].function.arguments | tojson }}}<|eot_id|>"
    "{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>{{ m.content }}"
    "<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>"
    "{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
    "{% endif %}"
)
TEMPLATES = {"hermes": HERMES_TEMPLATE, "llama3_json": LLAMA3_TEMPLATE}

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "Weather?"}]
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "c"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (HERMES_TEMPLATE, "hermes"),
        (LLAMA3_TEMPLATE, "llama3_json"),
        (CHAT_TEMPLATE, "generic"),  # no tools variable
        (None, "generic"),
        ({"default": CHAT_TEMPLATE, "tool_use": HERMES_TEMPLATE}, "hermes"),
        ("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}", "generic"),
    ],
)
def test_the_format_is_read_from_the_chat_template(template, expected):
    assert detect_tool_format(template).name == expected


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    from tests.tiny_models import train_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(out)
    return out


def test_a_native_template_renders_the_tools_the_call_and_its_result(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from llmc.runtime.chat_template import render_chat

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokenizer.chat_template = HERMES_TEMPLATE
    plan = plan_tools([ToolDefinition.model_validate(t) for t in TOOLS], "auto", None)
    fmt = detect_tool_format(tokenizer.chat_template)
    messages = template_messages([ChatMessage.model_validate(m) for m in HISTORY], native=True)
    prompt = render_chat(tokenizer, messages, tools=fmt.template_tools(plan))
    assert fmt.instructions(plan) is None  # the template describes the tools itself
    assert json.dumps(TOOLS[0]) in prompt
    # The earlier call with its arguments as an object, the result in its own turn.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}' in (
        prompt
    )
    assert "<tool_response>\n21 degrees\n</tool_response>" in prompt
    assert prompt.endswith("<|assistant|>")


def test_hermes_answers_parse_into_content_and_calls():
    fmt = ToolFormat("hermes")
    two = (
        'Checking.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    answer = fmt.parse(two)
    assert answer.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in answer.calls] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]
    assert len({c.id for c in answer.calls}) == 2
    for text in (
        "plain text",
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}',  # cut before its end
        '<tool_call>{"name": "a", "arguments": "x=1"}</tool_call>',  # arguments not an object
        "<tool_call>not json</tool_call>",
    ):
        assert fmt.parse(text).calls == () and fmt.parse(text).content == text


def test_llama3_answers_parse_into_one_call_or_text():
    fmt = ToolFormat("llama3_json")
    for text in (
        '{"name": "a", "parameters": {"x": 1}}',
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}',
        ' {"name": "a", "arguments": {"x": 1}} ',
    ):
        (call,) = fmt.parse(text).calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("a", {"x": 1})
    for text in ('{"name": "a"}', "It is sunny.", '{"x": 1}'):
        assert fmt.parse(text).calls == () and fmt.parse(text).content == text


# Two tools whose parameters each define a "Point" (of different shapes) and refer to their own
# root: each tool's references must resolve within its own parameters.
NESTED = {
    "type": "object",
    "properties": {"at": {"$ref": "#/$defs/Point"}, "next": {"$ref": "#"}},
    "required": ["at"],
    "$defs": {"Point": {"type": "array", "items": {"type": "integer"}}},
}
FLAT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$ref": "#/definitions/Point",
    "definitions": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}
REF_TOOLS = [
    {"type": "function", "function": {"name": "nested", "parameters": NESTED}},
    {"type": "function", "function": {"name": "flat", "parameters": FLAT}},
]


@pytest.mark.parametrize(  # a native format's "auto" is parsed, not constrained
    ("fmt", "choice"),
    [
        ("generic", "auto"),
        ("generic", "required"),
        ("hermes", "required"),
        ("llama3_json", "required"),
    ],
)
def test_parameters_with_local_references_compile_in_every_format(fmt, choice):
    import llguidance

    plan = plan_tools([ToolDefinition.model_validate(t) for t in REF_TOOLS], choice, None)
    constraint = ToolFormat(fmt).constraint(plan)
    if constraint.json is not None:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(constraint.json)
    else:
        grammar = llguidance.grammar_from("lark", constraint.grammar)
    assert llguidance.LLMatcher.validate_grammar(grammar, None) == ""


def test_only_references_outside_the_parameters_are_refused():
    def tool(parameters: dict) -> dict:
        return {"type": "function", "function": {"name": "f", "parameters": parameters}}

    within = {
        "properties": {"enum": {"$ref": "#/$defs/A"}, "c": {"const": {"$ref": "https://x.y"}}},
        "$defs": {"A": {"items": [{"$ref": "#"}]}},
    }
    ToolDefinition.model_validate(tool(within))  # a const's value is data, not a reference
    for ref in ("other.json", "https://x.y/s.json#/$defs/A"):
        outside = {"properties": {"a": {"anyOf": [{"items": [{"$ref": ref}]}]}}}
        with pytest.raises(ValidationError, match="refers outside the parameters"):
            ToolDefinition.model_validate(tool(outside))


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def native_server(
    request, tmp_path_factory, running_server: ServerFactory
) -> Iterator[tuple[str, LiveServer]]:
    """The real server on a tiny Llama whose chat template renders tools in ``request.param``'s
    syntax."""
    from transformers import AutoTokenizer

    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig
    from llmc.runtime.engine import LLMEngine
    from tests.tiny_models import make_tiny_llama

    root = tmp_path_factory.mktemp(request.param)
    ckpt = make_tiny_llama(root / "ckpt", max_position_embeddings=1024)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    tokenizer.chat_template = TEMPLATES[request.param]
    tokenizer.save_pretrained(ckpt)
    config = BuildConfig.of(
        model=str(ckpt), block_size=16, max_seq_len=1024, output=str(root / "e")
    )
    engine = LLMEngine.from_engine_dir(Path(build(config).engine_dir), num_blocks=128)
    with running_server(engine, "tiny", max_waiting=16) as server:
        yield request.param, server


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_required_native_calls_parse_validate_and_stream_alike(native_server):
    fmt, server = native_server
    client = _client(server)
    for seed in range(3):
        choice = client.chat.completions.create(
            model="tiny", messages=HISTORY, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=120,
        ).choices[0]  # fmt: skip
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    body = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                max_tokens=80, parallel_tool_calls=False)  # fmt: skip
    whole = client.chat.completions.create(**body).choices[0].message.tool_calls
    with client.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def test_auto_with_a_native_format_answers_in_text_or_calls(native_server):
    _, server = native_server
    choice = (
        _client(server)
        .chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=12
        )
        .choices[0]
    )
    # Random weights write no call syntax: the answer is the text, unconstrained.
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
