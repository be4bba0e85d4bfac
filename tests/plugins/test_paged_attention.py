"""llmc::PagedAttention: the CPU kernel against the torch reference, and the reference against
dense attention computed without paging (DESIGN §3)."""

from __future__ import annotations

import math
import platform
import shutil
import subprocess
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from llmc.plugins.paged_attention import cpu
from llmc.plugins.paged_attention.cpu import paged_attention_cpu
from llmc.plugins.paged_attention.reference import paged_attention_reference


@dataclass(frozen=True)
class Case:
    seqs: tuple[tuple[int, int], ...]  # per sequence: (context length after the step, new tokens)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    sliding_window: int | None = None
    logit_softcap: float | None = None


@dataclass
class Batch:
    """One step's inputs (numpy) plus each sequence's whole context, dense, to check against."""

    kv_pool: np.ndarray  # [2, num_blocks, block_size, KVH, D]: the caches are views of it
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    dense_keys: list[np.ndarray]  # per sequence [L, KVH, D]
    dense_values: list[np.ndarray]

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.q, self.k, self.v, self.kv_pool[0], self.kv_pool[1], self.seq_lens,
                self.query_start_loc, self.block_tables, self.slot_mapping)  # fmt: skip


def make_batch(case: Case, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    kvh, d, bs = case.num_kv_heads, case.head_dim, case.block_size
    blocks_per_seq = [math.ceil(length / bs) for length, _ in case.seqs]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks full of noise that must never be read
    # Shuffled ids: every sequence's blocks are out of order and interleaved with others'.
    ids = iter(rng.permutation(num_blocks).tolist())
    block_tables = np.zeros((len(case.seqs), max(blocks_per_seq) + 1), np.int32)
    kv_pool = rng.standard_normal((2, num_blocks, bs, kvh, d)).astype(np.float32)
    dense_keys, dense_values, slots, new_k, new_v = [], [], [], [], []
    for b, (length, num_new) in enumerate(case.seqs):
        block_tables[b, : blocks_per_seq[b]] = [next(ids) for _ in range(blocks_per_seq[b])]
        keys, values = rng.standard_normal((2, length, kvh, d)).astype(np.float32)
        dense_keys.append(keys)
        dense_values.append(values)
        for p in range(length):
            slot = int(block_tables[b, p // bs]) * bs + p % bs
            if p < length - num_new:  # already cached by earlier steps
                kv_pool[0].reshape(-1, kvh, d)[slot] = keys[p]
                kv_pool[1].reshape(-1, kvh, d)[slot] = values[p]
            else:
                slots.append(slot)
        new_k.append(keys[length - num_new :].reshape(num_new, kvh * d))
        new_v.append(values[length - num_new :].reshape(num_new, kvh * d))
    num_new_tokens = [n for _, n in case.seqs]
    return Batch(
        kv_pool=kv_pool,
        q=2 * rng.standard_normal((sum(num_new_tokens), case.num_heads * d)).astype(np.float32),
        k=np.concatenate(new_k),
        v=np.concatenate(new_v),
        seq_lens=np.array([length for length, _ in case.seqs], np.int32),
        query_start_loc=np.array([0, *np.cumsum(num_new_tokens)], np.int32),
        block_tables=block_tables,
        slot_mapping=np.array(slots, np.int64),
        dense_keys=dense_keys,
        dense_values=dense_values,
    )


def attention_kwargs(case: Case) -> dict:
    return dict(num_heads=case.num_heads, num_kv_heads=case.num_kv_heads,
                head_dim=case.head_dim, scale=case.head_dim**-0.5,
                sliding_window=case.sliding_window, logit_softcap=case.logit_softcap)  # fmt: skip


def run_reference(
    case: Case, batch: Batch, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference on copies of the batch: returns (out, key_cache, value_cache) as torch."""
    tensors = [torch.from_numpy(a.copy()) for a in batch.arrays()]
    for i in range(5):  # q, k, v and the caches in the tested dtype
        tensors[i] = tensors[i].to(dtype)
    out = paged_attention_reference(*tensors, **attention_kwargs(case))
    return out, tensors[3], tensors[4]


def dense_attention(case: Case, batch: Batch) -> np.ndarray:
    """Causal attention over each sequence's dense context in numpy float64, one token at a time:
    written apart from the reference (slicing the window, not masking) so either can catch the
    other."""
    kv_head = np.arange(case.num_heads) // (case.num_heads // case.num_kv_heads)  # [H]
    q = batch.q.astype(np.float64).reshape(-1, case.num_heads, case.head_dim)
    out = np.zeros_like(q)
    for b, (length, num_new) in enumerate(case.seqs):
        keys = batch.dense_keys[b].astype(np.float64)[:, kv_head]  # [L, H, D]
        values = batch.dense_values[b].astype(np.float64)[:, kv_head]
        for i in range(num_new):
            t, pos = int(batch.query_start_loc[b]) + i, length - num_new + i
            first = 0 if case.sliding_window is None else max(0, pos - case.sliding_window + 1)
            scores = np.einsum("nhd,hd->nh", keys[first : pos + 1], q[t]) * case.head_dim**-0.5
            if case.logit_softcap is not None:
                scores = case.logit_softcap * np.tanh(scores / case.logit_softcap)
            weights = np.exp(scores - scores.max(0))
            out[t] = np.einsum("nh,nhd->hd", weights / weights.sum(0), values[first : pos + 1])
    return out.reshape(len(q), -1)


def random_case(seed: int) -> Case:
    rng = np.random.default_rng(1000 + seed)
    num_kv_heads = int(rng.choice([1, 2]))
    group = int(rng.choice([1, 2, 4]))
    seqs = []
    for _ in range(int(rng.integers(1, 6))):
        length = int(rng.integers(1, 90))
        decode = rng.random() < 0.5
        seqs.append((length, 1 if decode else int(rng.integers(1, length + 1))))
    return Case(
        seqs=tuple(seqs),
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_dim=int(rng.choice([32, 64, 256])),
        block_size=int(rng.choice([1, 4, 16, 64])),
        sliding_window=None if rng.random() < 0.5 else int(rng.integers(1, 60)),
        logit_softcap=None if rng.random() < 0.6 else float(rng.uniform(1.0, 30.0)),
    )


CASES = {
    "decode-block-boundaries": Case(((15, 1), (16, 1), (17, 1), (1, 1)), 4, 4, 32, 16),
    "prefill-block-boundaries": Case(((15, 15), (16, 16), (17, 17)), 4, 2, 64, 16),
    "chunked-prefill": Case(((40, 24), (33, 17)), 4, 2, 64, 16),
    "mixed-gqa4": Case(((15, 15), (16, 1), (17, 1), (50, 20), (3, 3)), 8, 2, 64, 16),
    "gemma-mqa-d256": Case(((31, 31), (64, 1), (300, 1)), 4, 1, 256, 16),
    "mha": Case(((20, 5), (9, 1)), 3, 3, 32, 8),
    "gqa6-mqa": Case(((30, 10), (21, 1)), 6, 1, 64, 16),  # a group of 4 heads, then 2 single
    "gqa8": Case(((41, 9), (18, 1)), 16, 2, 32, 16),
    "window-smaller": Case(((60, 20), (45, 1), (70, 70)), 4, 1, 64, 16, sliding_window=8),
    "window-larger": Case(((60, 20), (45, 1)), 4, 2, 32, 16, sliding_window=1000),
    "window-one": Case(((20, 20), (5, 1)), 2, 1, 32, 4, sliding_window=1),
    "window-block": Case(((50, 10), (33, 1)), 4, 2, 32, 16, sliding_window=16),
    "softcap": Case(((40, 40), (25, 1)), 8, 2, 64, 16, logit_softcap=2.0),
    "softcap-window": Case(((70, 30), (90, 1)), 4, 1, 256, 16, 17, logit_softcap=30.0),
    "block-size-over-tile": Case(((150, 40), (97, 1)), 4, 2, 32, 64),
    "block-size-1": Case(((9, 4), (3, 1)), 2, 1, 32, 1),
    "sequence-without-new-tokens": Case(((10, 0), (12, 3), (7, 0)), 4, 2, 32, 4),
    # Long prefills run in tiles of 32 / G tokens: full and partial tiles, mid-block starts,
    # windows narrower than a tile, groups that do not divide 32, mixed with decodes.
    "long-prefill-mqa": Case(((300, 300), (64, 1)), 4, 1, 256, 16),
    "chunked-prefill-mid-block": Case(((300, 93), (40, 1), (77, 30)), 4, 1, 64, 16),
    "long-prefill-window-under-tile": Case(((300, 300),), 4, 1, 64, 16, sliding_window=5),
    "long-prefill-window-one": Case(((70, 70),), 2, 2, 32, 16, sliding_window=1),
    "long-prefill-gqa3-softcap": Case(((130, 77),), 6, 2, 48, 8, 40, logit_softcap=5.0),
    "long-prefill-mha-block-64": Case(((200, 150),), 2, 2, 32, 64, sliding_window=33),
    **{f"random-{seed}": random_case(seed) for seed in range(24)},
}
PARAMS = [pytest.param(case, i, id=name) for i, (name, case) in enumerate(CASES.items())]


@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_kernel_matches_reference(case: Case, seed: int) -> None:
    batch = make_batch(case, seed)
    expected, ref_keys, ref_values = run_reference(case, batch)

    out = paged_attention_cpu(*batch.arrays(), **attention_kwargs(case))

    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-4)
    # Written in place: the caches passed were views of kv_pool, and kv_pool holds the writes.
    np.testing.assert_array_equal(batch.kv_pool[0], ref_keys.numpy())
    np.testing.assert_array_equal(batch.kv_pool[1], ref_values.numpy())
    assert not np.shares_memory(out, batch.kv_pool)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_bf16_fpmath_rounds_q_k_v_and_weights_only(case: Case, seed: int) -> None:
    """fpmath_mode="bf16": on an AMX-BF16 host, prefill tiles equal float64 attention over q
    (scaled), k and v rounded to bfloat16 up to the rounding of the softmax weights (2^-9
    relative each: mean error <= 4e-4 measured; a key dropped from every full 32-key chunk made
    it 0.006 (median) and 0.04 (max)).
    Decodes, and every token on other hosts, equal the strict kernel exactly."""
    batch, strict_batch = make_batch(case, seed), make_batch(case, seed)
    scale = np.float32(case.head_dim**-0.5)
    rounded = replace(
        batch,
        q=bf16(batch.q * scale).astype(np.float64) / float(scale),
        dense_keys=[bf16(k) for k in batch.dense_keys],
        dense_values=[bf16(v) for v in batch.dense_values],
    )
    expected = dense_attention(case, rounded)

    out = paged_attention_cpu(*batch.arrays(), **attention_kwargs(case), fpmath_mode="bf16")
    strict = paged_attention_cpu(*strict_batch.arrays(), **attention_kwargs(case))

    np.testing.assert_array_equal(batch.kv_pool, strict_batch.kv_pool)  # float32 cache writes
    tiles = case.head_dim % 32 == 0 and case.head_dim <= 256 and cpu.bf16_prefill_available()
    for b, (_, num_new) in enumerate(case.seqs):
        rows = slice(int(batch.query_start_loc[b]), int(batch.query_start_loc[b + 1]))
        if tiles and num_new > 1:
            error = np.abs(out[rows] - expected[rows])
            assert error.max() < 3e-2 and error.mean() < 1e-3, (error.max(), error.mean())
            assert not np.array_equal(out[rows], strict[rows])  # the tiles ran
        else:
            np.testing.assert_array_equal(out[rows], strict[rows])


@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_reference_matches_dense_attention(case: Case, seed: int) -> None:
    batch = make_batch(case, seed)
    out, key_cache, _ = run_reference(case, batch)

    np.testing.assert_allclose(out.numpy(), dense_attention(case, batch), atol=1e-5, rtol=1e-4)
    rows = key_cache.view(-1, case.num_kv_heads, case.head_dim).numpy()
    for b, (length, _) in enumerate(case.seqs):  # every context position sits at its slot
        for p in range(length):
            slot = int(batch.block_tables[b, p // case.block_size]) * case.block_size
            np.testing.assert_array_equal(rows[slot + p % case.block_size], batch.dense_keys[b][p])


def test_reference_bfloat16_rounds_only_at_the_ends() -> None:
    case = CASES["mixed-gqa4"]
    batch = make_batch(case, 0)
    for array in (batch.q, batch.k, batch.v, batch.kv_pool, *batch.dense_keys,
                  *batch.dense_values):  # fmt: skip
        array[...] = torch.from_numpy(array).bfloat16().float().numpy()

    out, key_cache, _ = run_reference(case, batch, torch.bfloat16)

    assert out.dtype == torch.bfloat16 and key_cache.dtype == torch.bfloat16
    # Inputs exactly representable, float32 softmax: only the output's rounding remains.
    np.testing.assert_allclose(out.float().numpy(), dense_attention(case, batch), rtol=1e-2,
                               atol=1e-2)  # fmt: skip


def test_strided_rows_and_out_are_used_without_copies() -> None:
    """q, k, v as column slices of a fused QKV output; block_tables a slice of a wider table."""
    case = CASES["mixed-gqa4"]
    batch = make_batch(case, 1)
    expected, _, _ = run_reference(case, batch)
    qkv = np.concatenate([batch.q, batch.k, batch.v], axis=1)
    q_width, kv_width = batch.q.shape[1], batch.k.shape[1]
    wide_tables = np.full((len(case.seqs), batch.block_tables.shape[1] + 5), 99, np.int32)
    wide_tables[:, : batch.block_tables.shape[1]] = batch.block_tables
    out = np.full_like(batch.q, np.nan)
    arrays = list(batch.arrays())
    arrays[:3] = qkv[:, :q_width], qkv[:, q_width : q_width + kv_width], qkv[:, -kv_width:]
    arrays[7] = wide_tables[:, : batch.block_tables.shape[1]]

    result = paged_attention_cpu(*arrays, **attention_kwargs(case), out=out)

    assert result is out
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-4)


# name: (index into Batch.arrays(), how to spoil it, the error, its message)
BAD_INPUTS = {
    "q-float64": (0, lambda q: q.astype(np.float64), TypeError, "q must be float32"),
    "cache-float16": (3, lambda c: c.astype(np.float16), ValueError, "key_cache must be one of"),
    "cache-torch": (4, torch.from_numpy, TypeError, "value_cache must be a numpy array"),
    "cache-fortran": (3, np.asfortranarray, ValueError, "key_cache must be C-contiguous"),
    "q-strided": (0, lambda q: q[:, ::2], ValueError, "q must have contiguous rows"),
    "k-shape": (1, lambda k: k[:-1], ValueError, r"k must have shape \(41, 128\)"),
    "seq-lens-int64": (5, lambda s: s.astype(np.int64), TypeError, "seq_lens must be int32"),
    "seq-lens-short": (5, lambda s: s - 30, ValueError, "seq_lens"),
    "qsl-decreasing": (6, lambda s: s[::-1].copy(), ValueError, "query_start_loc"),
    "block-id": (7, lambda t: t + 1000, ValueError, "block id outside"),
    "slot": (8, lambda s: s + 10**6, ValueError, "slot outside"),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_inputs_are_refused_before_any_write(name: str) -> None:
    index, spoil, error, match = BAD_INPUTS[name]
    batch = make_batch(CASES["chunked-prefill"], 2)
    pool_before = batch.kv_pool.copy()
    arrays = list(batch.arrays())
    arrays[index] = spoil(arrays[index])
    with pytest.raises(error, match=match):
        paged_attention_cpu(*arrays, **attention_kwargs(CASES["chunked-prefill"]))
    np.testing.assert_array_equal(batch.kv_pool, pool_before)


def test_bad_head_counts_are_refused() -> None:
    batch = make_batch(CASES["chunked-prefill"], 3)
    kwargs = attention_kwargs(CASES["chunked-prefill"]) | {"num_heads": 3}
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention_cpu(*batch.arrays(), **kwargs)


def test_compiles_into_cache_when_extension_is_missing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source_sha256 = "0" * 64  # any key: the cache file is named after it

    path = cpu._compile(source_sha256)

    assert path.parent == tmp_path / "llmc" and path.exists()
    assert cpu._KernelLibrary(path).source_sha256 == source_sha256
    assert cpu._compile(source_sha256) == path  # second call: the cached file


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(cpu.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no C compiler was found"):
        cpu._compile("1" * 64)


@pytest.fixture(scope="module")
def portable_library(tmp_path_factory) -> cpu._KernelLibrary:
    """The kernel built for baseline x86-64 (no AVX2/FMA): its portable C loops, which an AVX2
    host's own build never runs."""
    if platform.machine() != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("needs gcc on x86-64")
    path = tmp_path_factory.mktemp("portable") / "paged_attention_portable.so"
    flags = [f for f in cpu.COMPILE_FLAGS if not f.startswith("-march")] + ["-march=x86-64"]
    command = ["gcc", *flags, "-shared", "-fPIC", "-o", str(path), *map(str, cpu._SOURCES)]
    subprocess.run(command, check=True, capture_output=True)
    return cpu._KernelLibrary(path)


@pytest.mark.parametrize(("case", "seed"), PARAMS)
def test_portable_build_matches_reference(case: Case, seed: int, portable_library,
                                          monkeypatch) -> None:  # fmt: skip
    monkeypatch.setattr(cpu, "load_library", lambda: portable_library)
    batch = make_batch(case, seed)
    expected, ref_keys, _ = run_reference(case, batch)

    out = paged_attention_cpu(*batch.arrays(), **attention_kwargs(case))

    np.testing.assert_allclose(out, expected.numpy(), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(batch.kv_pool[0], ref_keys.numpy())
