"""The accuracy report: perplexity, KL and top-1 agreement of two runners on the same windows,
checked against the same quantities computed from HF transformers' models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmc.calibration.accuracy import AccuracyReport, evaluate_accuracy
from llmc.calibration.data import split_texts, token_windows
from tests.tiny_models import SHAKESPEARE, make_tiny_gemma3

BLOCK = 4
SEQ_LEN = 24  # > the sliding window (8) and > 16 scored rows per chunk
NUM_WINDOWS = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints and OrtRunners over the unquantized graph of two tiny Gemma 3 models that
    differ only in their random seed, and held-out windows of Shakespeare."""
    from llmc.compiler.frontend.model_source import load_model, resolve_model
    from llmc.compiler.stages.export import float_graph
    from llmc.runtime.runners.ort_runner import OrtRunner

    root = tmp_path_factory.mktemp("accuracy")
    ckpts, runners = {}, {}
    for seed in (0, 1):
        ckpts[seed] = make_tiny_gemma3(root / f"seed{seed}", seed=seed, sharp=True)
        proto, _ = float_graph(load_model(resolve_model(str(ckpts[seed]))), BLOCK)
        runners[seed] = OrtRunner.from_model(proto, num_blocks=SEQ_LEN // BLOCK)
    tokenizer = AutoTokenizer.from_pretrained(ckpts[0])
    text = split_texts([SHAKESPEARE.read_text()[:20_000]], "heldout")
    windows = token_windows(text, tokenizer, NUM_WINDOWS, SEQ_LEN)
    return ckpts, runners, windows


def hf_logits(ckpt, windows) -> list[torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        return [model(torch.from_numpy(w)[None]).logits[0].double() for w in windows]


def hf_perplexity(ckpt, windows) -> float:
    """exp of the mean token loss HF computes from labels (its own shift by one)."""
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    total = 0.0
    with torch.no_grad():
        for w in windows:
            ids = torch.from_numpy(w)[None]
            total += model(ids, labels=ids).loss.item() * (len(w) - 1)
    return math.exp(total / sum(len(w) - 1 for w in windows))


def test_a_runner_against_itself_is_exact(models):
    _, runners, windows = models
    calls = []
    report = evaluate_accuracy(
        runners[0], runners[0], windows, BLOCK, "shakespeare", lambda d, t: calls.append((d, t))
    )
    assert calls == [(i + 1, NUM_WINDOWS) for i in range(NUM_WINDOWS)]
    assert report.num_windows == NUM_WINDOWS
    assert report.num_tokens == NUM_WINDOWS * (SEQ_LEN - 1)
    assert report.perplexity == report.perplexity_reference
    assert report.perplexity_change == 0.0
    assert abs(report.mean_kl) < 1e-12
    assert report.top1_agreement == 1.0
    assert report.data == "shakespeare"


def test_another_model_against_hf(models):
    """Perplexities equal HF's loss; KL and top-1 agreement equal those of HF's logits."""
    ckpts, runners, windows = models
    report = evaluate_accuracy(runners[0], runners[1], windows, BLOCK, "shakespeare")
    assert report.perplexity_reference == pytest.approx(hf_perplexity(ckpts[0], windows), rel=1e-3)
    assert report.perplexity == pytest.approx(hf_perplexity(ckpts[1], windows), rel=1e-3)
    assert report.perplexity_change == pytest.approx(
        report.perplexity / report.perplexity_reference - 1.0, rel=1e-9
    )
    ref, cand = hf_logits(ckpts[0], windows), hf_logits(ckpts[1], windows)
    kl, agree = 0.0, 0
    for r, c in zip(ref, cand, strict=True):
        p, q = torch.log_softmax(r[:-1], -1), torch.log_softmax(c[:-1], -1)
        kl += (p.exp() * (p - q)).sum().item()
        agree += (r[:-1].argmax(-1) == c[:-1].argmax(-1)).sum().item()
    assert report.mean_kl > 1e-3  # near-uniform random models: small, but far from 0
    assert report.mean_kl == pytest.approx(kl / report.num_tokens, rel=1e-3)
    assert report.top1_agreement < 1.0
    assert abs(report.top1_agreement * report.num_tokens - agree) <= 1  # a near-tie may flip


def test_report_round_trips_and_formats():
    report = AccuracyReport(
        data="held.txt",
        num_windows=2,
        num_tokens=254,
        perplexity_reference=10.0,
        perplexity=10.5,
        perplexity_change=0.05,
        mean_kl=0.0123,
        top1_agreement=0.9,
    )
    d = json.loads(json.dumps(report.to_dict()))
    assert AccuracyReport.from_dict({**d, "newer_field": 1}) == report
    text = report.format()
    assert "10.0000 -> 10.5000 (+5.000%)" in text
    assert "0.0123 nats" in text and "90.00%" in text and "held.txt" in text
    del d["mean_kl"]
    with pytest.raises(ValueError, match="mean_kl"):
        AccuracyReport.from_dict(d)
    with pytest.raises(ValueError, match="perplexity"):
        AccuracyReport.from_dict({**report.to_dict(), "perplexity": "high"})


def test_bad_inputs(models):
    _, runners, windows = models
    long = np.concatenate([windows[0], windows[1]])  # needs 12 blocks, the runner has 6
    with pytest.raises(ValueError, match="needs 12 KV blocks"):
        evaluate_accuracy(runners[0], runners[1], [long], BLOCK, "x")
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_accuracy(runners[0], runners[1], [windows[0][:1]], BLOCK, "x")
    with pytest.raises(ValueError, match="no windows"):
        evaluate_accuracy(runners[0], runners[1], [], BLOCK, "x")


def test_scoring_a_subset_of_positions_scores_those_rows():
    """``positions`` picks rows: the same numbers as scoring a window cut to those rows."""
    from llmc.calibration.accuracy import score_logits

    rng = np.random.default_rng(0)
    window = rng.integers(0, 50, 9)
    ref = rng.standard_normal((9, 50)).astype(np.float32)
    cand = ref + 0.3 * rng.standard_normal((9, 50)).astype(np.float32)
    rows = np.array([0, 3, 6], np.int64)
    sub = score_logits([(ref[rows], cand[rows])], [window], "x", positions=[rows])
    assert sub.num_tokens == 3
    # Each row alone, as a 2-token window whose second token is the row's target.
    singles = [
        score_logits([(ref[[r]], cand[[r]])], [window[[r, r + 1]]], "x").mean_kl for r in rows
    ]
    assert sub.mean_kl == pytest.approx(np.mean(singles), rel=1e-12)
    whole = score_logits([(ref, cand)], [window], "x")
    every = score_logits([(ref[:8], cand[:8])], [window], "x", positions=[np.arange(8)])
    assert every == whole


def test_chunked_logits_score_as_whole_windows():
    """Windows' logits given a few rows at a time (the layer-wise scorer's last segment) give
    the whole windows' report; chunks that skip rows or leave a window out are refused."""
    from llmc.calibration.accuracy import LogitsChunk, score_logit_chunks, score_logits

    rng = np.random.default_rng(3)
    windows = [rng.integers(0, 50, n) for n in (9, 5)]
    pairs = []
    for w in windows:
        ref = rng.standard_normal((len(w), 50)).astype(np.float32)
        pairs.append((ref, ref + 0.3 * rng.standard_normal(ref.shape).astype(np.float32)))
    whole = score_logits(pairs, windows, "x")

    def chunks(step):
        for i, (ref, cand) in enumerate(pairs):
            for s in range(0, len(ref), step):
                yield LogitsChunk(i, slice(s, s + step), ref[s : s + step], cand[s : s + step])

    for step in (1, 2, 4):
        got = score_logit_chunks(chunks(step), windows, "x")
        assert got.num_tokens == whole.num_tokens == 8 + 4
        assert got.mean_kl == pytest.approx(whole.mean_kl, rel=1e-12)
        assert got.perplexity == pytest.approx(whole.perplexity, rel=1e-12)
        assert got.top1_agreement == whole.top1_agreement
    skipping = [c for c in chunks(2) if c.rows.start != 2]
    with pytest.raises(ValueError, match="start at 4, not 2"):
        score_logit_chunks(skipping, windows, "x")
    with pytest.raises(ValueError, match="of 1 windows for 2"):
        score_logit_chunks([c for c in chunks(2) if c.window == 0], windows, "x")


@pytest.mark.parametrize("noise", [0.0, 0.003, 0.03, 1.0])
def test_scores_equal_a_float64_log_softmax_at_a_large_vocabulary(noise):
    """The float32 scoring keeps float64's numbers where KL is tiny (per-row 1e-6), under a
    shift of every logit (which changes nothing) and with a -inf reference logit (p = 0)."""
    from llmc.calibration.accuracy import score_logits

    rng = np.random.default_rng(7)
    ref = (8.0 * rng.standard_normal((40, 65536))).astype(np.float32)
    ref[3, 5] = -np.inf
    cand = (ref + noise * rng.standard_normal(ref.shape) + 0.7).astype(np.float32)
    cand[3, 5] = 0.0
    window = rng.integers(0, 65536, 41)
    report = score_logits([(ref, cand)], [window], "x")
    p, q = (torch.log_softmax(torch.from_numpy(a).double(), -1) for a in (ref, cand))
    kl = torch.where(p.exp() > 0, p.exp() * (p - q), 0.0).sum(-1).mean().item()
    targets = torch.from_numpy(window[1:])[:, None]
    nll_ref, nll = (-lp.gather(1, targets).mean().item() for lp in (p, q))
    if noise == 0.0:
        assert report.mean_kl == pytest.approx(kl, abs=1e-12)
    else:
        assert report.mean_kl == pytest.approx(kl, rel=1e-5)
    assert math.log(report.perplexity_reference) == pytest.approx(nll_ref, rel=1e-7)
    assert math.log(report.perplexity) == pytest.approx(nll, rel=1e-7)
    agree = (ref.argmax(-1) == cand.argmax(-1)).mean()
    assert report.top1_agreement == agree
