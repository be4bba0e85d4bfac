"""A server-sent event stays one line for line splitters that follow ``str.splitlines`` (httpx's
``iter_lines``), whatever text the model generated, and decodes back to that text."""

from __future__ import annotations

import json

import pytest
from httpx._decoders import LineDecoder

from llmc.runtime.server.responses import CompletionChoice, CompletionResponse
from llmc.runtime.server.streaming import sse_event

# Every character str.splitlines takes as a line end (Python's documentation, str.splitlines).
LINE_ENDS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("line_end", LINE_ENDS, ids=[f"U+{ord(c[-1]):04X}" for c in LINE_ENDS])
def test_generated_line_ends_stay_inside_one_event_line(line_end: str) -> None:
    text = f"before{line_end}after é"
    chunk = CompletionResponse(id="cmpl-1", model="m", choices=[CompletionChoice(text=text)])
    decoder = LineDecoder()
    lines = decoder.decode(sse_event(chunk)) + decoder.flush()
    data = [line for line in lines if line]
    assert len(data) == 1, lines
    assert data[0].startswith("data: ")
    assert json.loads(data[0].removeprefix("data: "))["choices"][0]["text"] == text
    assert text.splitlines() != [text]  # the character is a line end to str.splitlines
