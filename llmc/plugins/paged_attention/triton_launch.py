"""The torch launcher of the Triton paged-attention kernels.

:func:`paged_attention_triton` runs :func:`~llmc.plugins.paged_attention.triton_kernel.
paged_attention_kernel` on torch tensors (CUDA, or CPU under ``TRITON_INTERPRET=1``) with the
reference's signature, and for decode tokens the flash-decoding kernels of
:mod:`~llmc.plugins.paged_attention.triton_flash_decoding` when
:func:`~llmc.plugins.paged_attention.triton_tiles.choose_num_splits` says so. The tile sizes,
kernel constants, shared memory and split count come from
:mod:`~llmc.plugins.paged_attention.triton_tiles` (pure, shared with the TensorRT AOT compile
and its lint). Imports ``triton`` only when a kernel is launched.
"""

from __future__ import annotations

import torch

from llmc.engine.plugin import KernelArguments, PluginInputs, plugin_kernel
from llmc.plugins.paged_attention.triton_tiles import (
    KernelConfig,
    KernelConstants,
    choose_block_m,
    choose_num_splits,
    kernel_config,
    kernel_constants,
)

_ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Software-pipelining depth of the key loop for 16-bit activations: on an H100 against 1 stage,
#: batched long-context decode 1.3x and chunked prefill 1.6-1.9x faster, one-sequence prefill
#: of Llama-3-8B 3% slower; the shared memory Triton reports for bf16/fp16 is unchanged
#: (``benchmarks/bench_triton_tiles.py``, benchmarks/RESULTS.md).
PIPELINED_STAGES = 3


def cache_quant_of(cache_dtype: torch.dtype, activation_dtype: torch.dtype) -> str:
    """The ``CACHE_QUANT`` kind of a cache dtype; ValueError for one the kernel cannot hold."""
    if cache_dtype == activation_dtype:
        return "none"
    if cache_dtype == torch.float8_e4m3fn:
        return "fp8"
    if cache_dtype == torch.int8:
        return "int8"
    raise ValueError(
        f"key_cache and value_cache must be {activation_dtype} (the activations' dtype), "
        f"float8_e4m3fn or int8, got {cache_dtype}"
    )


def _check(name: str, tensor: torch.Tensor, dtypes: tuple[torch.dtype, ...], ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} must be one of {dtypes}, got {tensor.dtype}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (read and written in place, never copied)")


@plugin_kernel
def paged_attention_triton(
    inputs: PluginInputs,
    a: KernelArguments,
    *,
    block_m: int | None = None,
    block_n: int = 32,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Write the new tokens' K/V into the paged cache in place, then attend causally (Triton).

    Same signature (then the options below) and result as
    :func:`~llmc.plugins.paged_attention.reference.paged_attention_reference`, on torch tensors
    of one device (CUDA, or CPU under ``TRITON_INTERPRET=1``): q [T, H*D], k and v [T, KVH*D]
    in float32, float16 or bfloat16; caches [num_blocks, block_size, KVH, D] in q's dtype,
    ``torch.float8_e4m3fn`` or ``torch.int8``, written in place (same storage, never copied);
    seq_lens [B], query_start_loc [B+1], block_tables [B, max_blocks] int32; slot_mapping [T]
    int64. ``block_m``/``block_n``: tile sizes (see :func:`kernel_config`); ``block_m``
    None chooses by the step's shape (:func:`choose_block_m`). ``num_splits``:
    slices of each decode token's context (flash-decoding); None chooses with
    :func:`choose_num_splits` (on CPU, where the interpreter runs programs one at a time, 1),
    1 keeps decode on the main kernel. ``out``: where to write the result ([T, H*D], q's dtype,
    contiguous), e.g. a TensorRT output buffer. ``num_warps``/``num_stages``: Triton's launch
    options for every kernel of the call (:class:`~.triton_tiles.KernelConfig`); ``num_stages``
    None pipelines the key loop :data:`PIPELINED_STAGES` deep for 16-bit activations, 1 for
    float32 (whose pipelined tiles would not fit the shared memory the TensorRT lint allows).

    Returns:
        [T, H*D] in q's dtype (``out`` when given).

    Raises:
        ValueError: a dtype, rank, shape or layout the kernel does not take, a scale that is
            not a finite positive number, or ``num_splits`` below 1. Metadata values (block
            ids, slots, lengths) are not checked on the device: the runner's step builder
            guarantees them.
    """
    q = inputs.q
    cache_quant = _check_dtypes(inputs)
    num_tokens, num_seqs = q.shape[0], inputs.seq_lens.shape[0]
    config = _kernel_config(
        a, q.dtype, num_tokens, num_seqs, block_m, block_n, num_warps, num_stages
    )
    _check_shapes(inputs, a)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")

    if out is None:
        out = torch.empty_like(q)
    _check("out", out, (q.dtype,), 2)
    if out.shape != q.shape:
        raise ValueError(f"out must have shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if num_tokens == 0 or num_seqs == 0:
        return out
    _launch(inputs, a, config, cache_quant, num_splits, out)
    return out


def _check_dtypes(inputs: PluginInputs) -> str:
    """Check the inputs' dtypes, ranks and contiguity; return the cache's ``CACHE_QUANT`` kind."""
    q = inputs.q
    _check("q", q, _ACTIVATION_DTYPES, 2)
    _check("k", inputs.k, (q.dtype,), 2)
    _check("v", inputs.v, (q.dtype,), 2)
    key_cache = inputs.key_cache
    cache_quant = cache_quant_of(key_cache.dtype, q.dtype)
    _check("key_cache", key_cache, (key_cache.dtype,), 4)
    _check("value_cache", inputs.value_cache, (key_cache.dtype,), 4)
    for name, tensor, ndim in (
        ("seq_lens", inputs.seq_lens, 1),
        ("query_start_loc", inputs.query_start_loc, 1),
        ("block_tables", inputs.block_tables, 2),
    ):
        _check(name, tensor, (torch.int32,), ndim)
    _check("slot_mapping", inputs.slot_mapping, (torch.int64,), 1)
    return cache_quant


def _kernel_config(
    a: KernelArguments,
    dtype: torch.dtype,
    num_tokens: int,
    num_seqs: int,
    block_m: int | None,
    block_n: int,
    num_warps: int,
    num_stages: int | None,
) -> KernelConfig:
    """The launcher's options as a :class:`KernelConfig`, ``None`` ones chosen for the step."""
    num_heads, num_kv_heads, head_dim = a.num_heads, a.num_kv_heads, a.head_dim
    if block_m is None:
        group_pad = kernel_config(num_heads, num_kv_heads, head_dim).group_pad
        block_m = choose_block_m(num_tokens, num_seqs, group_pad)
    if num_stages is None:
        num_stages = PIPELINED_STAGES if dtype in (torch.float16, torch.bfloat16) else 1
    return kernel_config(
        num_heads, num_kv_heads, head_dim, block_m=block_m, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def _check_shapes(inputs: PluginInputs, a: KernelArguments) -> None:
    """Check the inputs' shapes against each other and the head counts, and the scales."""
    num_kv_heads, head_dim = a.num_kv_heads, a.head_dim
    q, key_cache, block_tables = inputs.q, inputs.key_cache, inputs.block_tables
    num_tokens, num_seqs = q.shape[0], inputs.seq_lens.shape[0]
    cache_shape = (key_cache.shape[0], key_cache.shape[1], num_kv_heads, head_dim)
    expected = {
        "q": (q, (num_tokens, a.num_heads * head_dim)),
        "k": (inputs.k, (num_tokens, num_kv_heads * head_dim)),
        "v": (inputs.v, (num_tokens, num_kv_heads * head_dim)),
        "key_cache": (key_cache, cache_shape),
        "value_cache": (inputs.value_cache, cache_shape),
        "query_start_loc": (inputs.query_start_loc, (num_seqs + 1,)),
        "block_tables": (block_tables, (num_seqs, block_tables.shape[1])),
        "slot_mapping": (inputs.slot_mapping, (num_tokens,)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    for name, value in (("scale", a.scale), ("k_scale", a.k_scale), ("v_scale", a.v_scale)):
        if not 0.0 < float(value) < float("inf"):
            raise ValueError(f"{name} must be a finite positive number, got {value}")


def _launch(
    inputs: PluginInputs,
    a: KernelArguments,
    config: KernelConfig,
    cache_quant: str,
    num_splits: int | None,
    out: torch.Tensor,
) -> None:
    """Launch the main kernel (cache write, attention) and, for ``num_splits`` > 1, the
    flash-decoding kernels, on checked non-empty inputs; writes ``out`` and the caches."""
    import triton

    from llmc.plugins.paged_attention.triton_kernel import paged_attention_kernel

    q, key_cache, value_cache = inputs.q, inputs.key_cache, inputs.value_cache
    num_tokens, num_seqs = q.shape[0], inputs.seq_lens.shape[0]
    max_blocks = inputs.block_tables.shape[1]
    if num_splits is None:
        num_splits = 1  # the interpreter: one program at a time, a split only adds work
        if q.is_cuda:
            num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            max_context_len = max_blocks * key_cache.shape[1]
            num_splits = choose_num_splits(num_seqs, a.num_kv_heads, max_context_len, num_sms)
    constants = kernel_constants(
        config,
        **a._asdict(),
        block_size=key_cache.shape[1],
        cache_quant=cache_quant,
        # Interpreted kernels are not JITFunctions (trt_aot.py tells them apart the same way).
        upcast_dot=q.dtype == torch.bfloat16
        and not isinstance(paged_attention_kernel, triton.runtime.JITFunction),
    )
    launch = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    grid = config.grid(num_tokens, num_seqs, a.num_kv_heads)
    if cache_quant == "fp8":  # the kernel reads and writes FP8 codes as bytes (same storage)
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        inputs = inputs._replace(key_cache=key_cache, value_cache=value_cache)
    paged_attention_kernel[grid](
        *inputs, num_seqs, max_blocks, out, key_cache, value_cache,
        C=constants, SPLIT_DECODE=num_splits > 1, **launch,
    )  # fmt: skip
    if num_splits > 1:
        _flash_decoding(inputs, num_splits, out, constants, launch)


def _flash_decoding(
    inputs: PluginInputs,
    num_splits: int,
    out: torch.Tensor,
    constants: KernelConstants,
    launch: dict[str, int],
) -> None:
    """The decode tokens' attention in ``num_splits`` slices, then their reduction into ``out``
    (triton_flash_decoding.py): partials [B, S, H, D] and [B, S, H] in float32. ``inputs``: the
    launcher's, an FP8 cache as its uint8 view."""
    import triton

    from llmc.plugins.paged_attention.triton_flash_decoding import (
        flash_decoding_reduce_kernel,
        flash_decoding_split_kernel,
    )

    num_seqs, num_heads = inputs.seq_lens.shape[0], constants.NUM_HEADS
    head_dim, num_kv_heads = constants.HEAD_DIM, constants.NUM_KV_HEADS
    device = inputs.q.device
    partial_out = torch.empty(
        (num_seqs, num_splits, num_heads, head_dim), dtype=torch.float32, device=device
    )
    partial_lse = torch.empty((num_seqs, num_splits, num_heads), dtype=torch.float32, device=device)
    # The split kernel takes every input but slot_mapping: the main kernel wrote the cache.
    read = [tensor for name, tensor in inputs._asdict().items() if name != "slot_mapping"]
    flash_decoding_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        *read, inputs.block_tables.shape[1], num_splits, partial_out, partial_lse,
        C=constants, **launch,
    )  # fmt: skip
    flash_decoding_reduce_kernel[(num_seqs, num_heads)](
        partial_out, partial_lse, inputs.query_start_loc, num_splits, out,
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=constants.BLOCK_D,
        SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=launch["num_warps"],
    )  # fmt: skip
