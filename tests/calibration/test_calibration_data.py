"""Calibration and held-out text: file checks, the split, token windows, sampled text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from llmc.calibration.data import (
    CalibrationDataError,
    load_windows,
    read_texts,
    sample_texts,
    sampled_label,
    split_texts,
    token_windows,
)
from tests.tiny_models import SHAKESPEARE, make_tiny_llama


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("llama") / "ckpt")


@pytest.fixture(scope="module")
def tokenizer(ckpt):
    return AutoTokenizer.from_pretrained(ckpt)


def write(path, content: str | bytes):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_reads_txt_and_jsonl(tmp_path):
    assert read_texts(write(tmp_path / "a.txt", "one text\n\nwith lines\n")) == [
        "one text\n\nwith lines\n"
    ]
    lines = [json.dumps({"text": "first", "id": 1}), "", json.dumps({"text": "second"})]
    assert read_texts(write(tmp_path / "a.jsonl", "\n".join(lines) + "\n")) == ["first", "second"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("data.csv", "a,b\n", r"data\.csv: unsupported file type '\.csv'"),
        ("empty.txt", "", r"empty\.txt is empty"),
        ("blank.txt", " \n\t\n", r"blank\.txt is empty"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), r"latin1\.txt is not UTF-8 .*offset 3"),
        ("blank.jsonl", "\n\n", r"blank\.jsonl is empty"),
        ("bad.jsonl", '{"text": "ok"}\n\n{"text": "no\n', r"bad\.jsonl, line 3: not JSON"),
        ("notext.jsonl", '{"text": "ok"}\n{"body": "x"}\n', r"notext\.jsonl, line 2: .*\"text\""),
        ("emptytext.jsonl", '{"text": "  "}\n', r"emptytext\.jsonl, line 1: .*non-empty"),
        ("number.jsonl", '{"text": 3}\n', r"number\.jsonl, line 1"),
        ("list.jsonl", '["text"]\n', r"list\.jsonl, line 1"),
    ],
)
def test_bad_files_name_the_file_and_the_reason(tmp_path, name, content, message):
    path = write(tmp_path / name, content)
    with pytest.raises(CalibrationDataError, match=message):
        read_texts(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CalibrationDataError, match=r"nope\.txt does not exist"):
        read_texts(tmp_path / "nope.txt")
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(CalibrationDataError, match=r"dir\.jsonl is not a file"):
        read_texts(tmp_path / "dir.jsonl")


def test_one_text_splits_by_characters_at_whitespace_without_overlap():
    text = SHAKESPEARE.read_text()[:10_007]
    calibration = split_texts([text], "calibration")
    heldout = split_texts([text], "heldout")
    assert len(calibration) == len(heldout) == 1
    assert calibration[0] + heldout[0] == text  # no overlap, nothing lost
    cut = len(calibration[0])
    assert abs(cut - 0.8 * len(text)) < 40
    assert heldout[0][0].isspace() and not calibration[0][-1].isspace()
    half = split_texts([text], "heldout", heldout_fraction=0.5)[0]
    assert text.endswith(half) and abs(len(half) - len(text) / 2) < 40


def test_several_texts_split_by_records():
    texts = [f"record {i}" for i in range(10)]
    assert split_texts(texts, "calibration") == texts[:8]
    assert split_texts(texts, "heldout") == texts[8:]
    assert split_texts(texts[:2], "calibration") == texts[:1]  # at least one each
    assert split_texts(texts[:2], "heldout") == texts[1:2]


def test_split_errors():
    for text in ("a", "hello    "):  # one part would have no text
        with pytest.raises(CalibrationDataError, match="too short"):
            split_texts([text], "heldout")
    assert split_texts(["abcdefghij"], "heldout") == ["ij"]  # no whitespace: cut anywhere
    with pytest.raises(ValueError, match="part"):
        split_texts(["a b c"], "train")
    with pytest.raises(ValueError, match="heldout_fraction"):
        split_texts(["a b c"], "heldout", heldout_fraction=1.0)


def test_token_windows_are_consecutive_and_start_with_bos(tokenizer):
    text = SHAKESPEARE.read_text()[:5000]
    windows = token_windows([text], tokenizer, num_windows=3, seq_len=16)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(windows) == 3
    for i, w in enumerate(windows):
        assert w.dtype == np.int64 and w.shape == (16,)
        assert w[0] == tokenizer.bos_token_id
        assert w[1:].tolist() == ids[i * 15 : (i + 1) * 15]


def test_token_windows_join_texts_and_cross_pieces(tokenizer):
    texts = ["First text.", "Second text."]
    ids = tokenizer.encode("First text.\n\nSecond text.", add_special_tokens=False)
    windows = token_windows(texts, tokenizer, num_windows=100, seq_len=4)
    assert len(windows) == len(ids) // 3 < 100  # as many full windows as fit
    assert np.concatenate([w[1:] for w in windows]).tolist() == ids[: len(windows) * 3]
    # Long enough that it is tokenized in several pieces: the same tokens as the whole text.
    long = SHAKESPEARE.read_text()[:200_000]
    ids = tokenizer.encode(long, add_special_tokens=False)
    n = (len(ids) - 10) // 511
    windows = token_windows([long], tokenizer, num_windows=n, seq_len=512)
    assert len(windows) == n
    assert np.concatenate([w[1:] for w in windows]).tolist() == ids[: n * 511]


def test_too_little_text_says_how_many_tokens(tokenizer):
    with pytest.raises(CalibrationDataError, match=r"has \d+ tokens, but one window of 64"):
        token_windows(["To be, or not to be"], tokenizer, num_windows=1, seq_len=64)
    with pytest.raises(ValueError):
        token_windows(["text"], tokenizer, num_windows=0, seq_len=8)


def test_sampled_texts_follow_the_seed_and_leave_global_rng_alone(ckpt, tokenizer):
    from llmc.compiler.frontend.model_source import load_model, resolve_model

    model = load_model(resolve_model(str(ckpt)))  # routed to paged attention
    attention = model.config._attn_implementation
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = sample_texts(model, tokenizer, num_texts=3, max_new_tokens=12, seed=0)
    assert torch.equal(torch.rand(3), expected_next)  # the global RNG state was restored
    assert model.config._attn_implementation == attention
    assert a == sample_texts(model, tokenizer, num_texts=3, max_new_tokens=12, seed=0)
    b = sample_texts(model, tokenizer, num_texts=3, max_new_tokens=12, seed=1)
    assert len(a) == 3 and a != b and len(set(a)) == 3
    assert all(len(tokenizer.encode(t, add_special_tokens=False)) >= 8 for t in a)


def test_load_windows_from_file_and_from_samples(ckpt, tokenizer, tmp_path):
    from llmc.compiler.frontend.model_source import load_model, resolve_model

    records = [{"text": SHAKESPEARE.read_text()[i * 2000 : (i + 1) * 2000]} for i in range(10)]
    path = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in records))
    held, label = load_windows("heldout", path, None, tokenizer, num_windows=2, seq_len=32)
    assert label == str(path.resolve())
    heldout_ids = tokenizer.encode(records[8]["text"], add_special_tokens=False)
    assert held[0][1:].tolist() == heldout_ids[:31]
    calib, _ = load_windows("calibration", path, None, tokenizer, num_windows=2, seq_len=32)
    assert (
        calib[0][1:].tolist() == tokenizer.encode(records[0]["text"], add_special_tokens=False)[:31]
    )

    model = load_model(resolve_model(str(ckpt)))
    windows, label = load_windows("heldout", None, model, tokenizer, num_windows=3, seq_len=16)
    assert label == sampled_label(1) and len(windows) == 3
    calib, label = load_windows("calibration", None, model, tokenizer, num_windows=3, seq_len=16)
    assert label == sampled_label(0)
    assert not np.array_equal(np.stack(windows), np.stack(calib))
