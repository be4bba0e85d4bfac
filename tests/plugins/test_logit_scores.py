"""The accuracy report's row kernel against float64 log-softmax, row by row, built for this
host and for the AVX2 and plain x86-64 bodies."""

import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import llmc.plugins
from llmc.plugins.logit_scores import logit_row_sums

PLUGINS = Path(llmc.plugins.__file__).parent
MARCHES = ["native", "haswell", "x86-64"]


@pytest.fixture(scope="module", params=MARCHES)
def library(request, tmp_path_factory) -> Path:
    """The kernel alone built with ``-march=<param>`` (haswell: AVX2 and FMA, no AVX-512)."""
    if request.param != "native" and platform.machine() != "x86_64":
        pytest.skip("an x86-64 -march")
    sources = [PLUGINS / "logit_scores/logit_scores.c", PLUGINS / "paged_attention/thread_pool.c"]
    path = tmp_path_factory.mktemp("logit_scores") / f"ls_{request.param}.so"
    flags = ["-O2", f"-march={request.param}", "-fno-math-errno", "-shared", "-fPIC", "-pthread"]
    subprocess.run(["gcc", *flags, *map(str, sources), "-o", str(path)], check=True)
    return path


def float64_rows(ref, cand, targets):
    """[N, 4]: NLL of each, KL(ref || cand), argmax agreement, in float64 torch."""
    p, q = (torch.log_softmax(torch.from_numpy(a).double(), -1) for a in (ref, cand))
    kl = torch.where(p.exp() > 0, p.exp() * (p - q), 0.0).sum(-1)
    t = torch.from_numpy(targets)[:, None]
    agree = torch.from_numpy(ref.argmax(-1) == cand.argmax(-1)).double()
    return torch.stack([-p.gather(1, t)[:, 0], -q.gather(1, t)[:, 0], kl, agree], 1).numpy()


@pytest.mark.parametrize("vocab", [7, 16, 1000, 4099 + 2048])
@pytest.mark.parametrize("noise", [0.001, 0.1, 3.0])
def test_rows_equal_float64(library, vocab, noise):
    """Every row, at vocabularies with and without a tail past the vector width and a block."""
    rng = np.random.default_rng(vocab)
    ref = (6.0 * rng.standard_normal((9, vocab))).astype(np.float32)
    cand = (ref + noise * rng.standard_normal(ref.shape) - 2.5).astype(np.float32)
    targets = rng.integers(0, vocab, 9)
    got, want = logit_row_sums(ref, cand, targets, library), float64_rows(ref, cand, targets)
    # NLL to float32's resolution of the logits; KL relative to its size, down to 1e-10 nats
    np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[:, 2], want[:, 2], rtol=3e-5, atol=1e-10)
    np.testing.assert_array_equal(got[:, 3], want[:, 3])


def test_maxima_in_the_tail_and_minus_infinity(library):
    """The argmax found past the last full vector; a -inf reference logit is probability 0."""
    vocab = 1000 + 5
    ref = np.zeros((2, vocab), np.float32)
    cand = np.zeros((2, vocab), np.float32)
    ref[0, vocab - 2], cand[0, vocab - 1] = 9.0, 9.0  # disagree, both in the tail
    ref[1, vocab - 1], cand[1, vocab - 1] = 9.0, 8.0  # agree in the tail
    ref[:, 3], cand[:, 3] = -np.inf, 4.0
    targets = np.array([1, 2])
    got, want = logit_row_sums(ref, cand, targets, library), float64_rows(ref, cand, targets)
    np.testing.assert_array_equal(got[:, 3], [0.0, 1.0])
    np.testing.assert_allclose(got[:, :3], want[:, :3], rtol=3e-5, atol=1e-6)


def test_the_installed_library_scores_as_its_own_build(library):
    """The kernel library the accuracy report loads gives this build's numbers (native: the
    same flags but -O3)."""
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((5, 3000)).astype(np.float32)
    cand = (ref + 0.05 * rng.standard_normal(ref.shape)).astype(np.float32)
    targets = rng.integers(0, 3000, 5)
    np.testing.assert_allclose(
        logit_row_sums(ref, cand, targets), logit_row_sums(ref, cand, targets, library), rtol=1e-5
    )


def test_bad_inputs():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="targets outside"):
        logit_row_sums(x, x, np.array([0, 8]))
    with pytest.raises(ValueError, match="logits"):
        logit_row_sums(x, x[:, :4], np.array([0, 1]))
    assert logit_row_sums(x[:0], x[:0], np.zeros(0, np.int64)).shape == (0, 4)
