"""Part 3 of ``ci/gpu_acceptance.py``: Triton's shared memory of the paged-attention kernels,
compiled for a GPU architecture (no GPU needed), against ``triton_tiles.shared_memory_bytes``
(the TensorRT lint's formula), which must not be lower."""

from __future__ import annotations


def compiled_shared_memory(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: str, arch: int, config
) -> tuple[int, int, int]:
    """Triton's shared memory (bytes) of the main, split and reduce kernels compiled for
    ``arch`` (80, 90, ...) with ``config``'s tiles and launch options, as the launcher launches
    them. Needs no GPU; needs a process without TRITON_INTERPRET."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from llmc.plugins.paged_attention import triton_flash_decoding as fd
    from llmc.plugins.paged_attention import triton_kernel as tk
    from llmc.plugins.paged_attention.triton_tiles import MAX_SPLITS, kernel_constants

    name = str(dtype).removeprefix("torch.")
    act = "*" + {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[name]
    constants = kernel_constants(
        config, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=16, scale=head_dim**-0.5, sliding_window=512, logit_softcap=None,
        cache_quant="none", k_scale=1.0, v_scale=1.0,
    )  # fmt: skip
    pointers = [act] * 5 + ["*i32"] * 3
    main_types = [*pointers, "*i64", "i32", "i32", act, act, act]
    main_names = (*tk.POINTER_INPUTS, *tk.SCALAR_INPUTS, *tk.POINTER_OUTPUTS)
    split_names = (*tk.POINTER_INPUTS[:8], "max_blocks", "num_splits", "partial_out_ptr",
                   "partial_lse_ptr")  # fmt: skip
    split_types = [*pointers, "i32", "i32", "*fp32", "*fp32"]
    reduce_constants = dict(NUM_HEADS=num_heads, HEAD_DIM=head_dim,
                            SPLITS_PAD=MAX_SPLITS, BLOCK_D=config.block_d)  # fmt: skip
    reduce_signature = {"partial_out_ptr": "*fp32", "partial_lse_ptr": "*fp32",
                        "query_start_loc_ptr": "*i32", "num_splits": "i32",
                        "out_ptr": act}  # fmt: skip
    kernels = (
        (tk.paged_attention_kernel, dict(zip(main_names, main_types, strict=True)),
         dict(C=constants, SPLIT_DECODE=True)),
        (fd.flash_decoding_split_kernel, dict(zip(split_names, split_types, strict=True)),
         dict(C=constants)),
        (fd.flash_decoding_reduce_kernel, reduce_signature, reduce_constants),
    )  # fmt: skip
    shared = []
    for fn, signature, consts in kernels:
        signature = {**signature, **dict.fromkeys(consts, "constexpr")}
        compiled = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=consts),
            target=GPUTarget("cuda", arch, 32),
            options=dict(num_warps=config.num_warps, num_stages=config.num_stages),
        )
        shared.append(compiled.metadata.shared)
    return tuple(shared)


def shared_memory_part(shapes, dtypes: list[str], arch: int) -> bool:
    """Compile the kernels for ``sm{arch}`` and compare Triton's shared memory (bytes) with
    ``shared_memory_bytes``; True when every one matches and fits."""
    from llmc.plugins.paged_attention.triton_tiles import kernel_config, shared_memory_bytes

    print(f"\nshared memory, compiled for sm{arch} (bytes; 49152 = 48 KB without opt-in)")
    print(f"{'shape':<22}{'dtype':<10}{'formula':>9}{'main':>8}{'split':>8}{'reduce':>8}")
    ok = True
    for shape in shapes:
        for dtype in dtypes:
            config = kernel_config(shape.num_heads, shape.num_kv_heads, shape.head_dim)
            formula = shared_memory_bytes(shape.head_dim, dtype, config)
            measured = compiled_shared_memory(shape.num_heads, shape.num_kv_heads,
                                              shape.head_dim, dtype, arch, config)  # fmt: skip
            verdict = "ok" if max(measured) <= formula else "FAIL: formula below Triton's count"
            ok &= max(measured) <= formula
            print(f"{shape.name:<22}{dtype:<10}{formula:>9}{measured[0]:>8}{measured[1]:>8}"
                  f"{measured[2]:>8}  {verdict}")  # fmt: skip
    return ok
