"""The CPU kernel of ``llmc::PagedAttention``: ctypes binding of ``paged_attention.c`` (and parts).

Activations are float32; the KV cache is float32, FP8 E4M3FN or int8 (``--kv-cache-dtype``
``auto``, ``fp8``, ``int8``; see :func:`paged_attention_cpu`).

The library is the extension ``setup.py`` builds next to this file (``pip install -e .``). A
checkout without it, or with one built from older sources, compiles the sources with gcc once
into ``$XDG_CACHE_HOME/llmc`` (default ``~/.cache/llmc``) instead, keyed by the sources' sha256
and the flags.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np

from llmc.cache_home import cache_home
from llmc.engine.kv_cache import NUMPY_DTYPES
from llmc.engine.plugin import FPMATH_MODES, KernelArguments, PluginInputs, plugin_kernel
from llmc.plugins.sources import COMPILE_FLAGS, KERNEL_HASHED, KERNEL_SOURCES

_DIR = Path(__file__).parent
#: The kernel's C sources, compiled together into one library (``llmc.plugins.sources``).
_SOURCES = tuple(_DIR.parent / name for name in KERNEL_SOURCES)
#: What the kernel is built from, in the order its digest hashes it: sources, then headers.
_HASHED = tuple(_DIR.parent / name for name in KERNEL_HASHED)

# The C kernel's PA_CACHE_* codes.
_CACHE_DTYPE_CODES = {dtype: code for code, dtype in enumerate(NUMPY_DTYPES.values())}


class _KernelLibrary:
    """The loaded shared library, with its function's signature declared once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        library = ctypes.CDLL(str(path))
        source_sha256 = library.llmc_pa_source_sha256
        source_sha256.restype = ctypes.c_char_p
        self.source_sha256: str = source_sha256().decode()
        ptr, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        self.paged_attention = library.llmc_paged_attention_on
        self.paged_attention.restype = ctypes.c_int
        self.paged_attention.argtypes = [
            ptr,  # parallel: NULL, the kernel's own thread pool
            ptr, i64, ptr, i64, ptr, i64,  # q, k, v and their row strides
            ptr, ptr, i64, i32,  # key_cache, value_cache, num_blocks, block_size
            ptr, ptr, ptr, i64, i32,  # seq_lens, query_start_loc, block_tables, stride, max_blocks
            ptr, ptr,  # slot_mapping, out
            i32, i32, i32, i32, i32,  # num_tokens, num_seqs, num_heads, num_kv_heads, head_dim
            f32, i32, f32,  # scale, sliding_window, softcap
            i32, f32, f32,  # cache dtype code, k_scale, v_scale
            i32,  # fpmath_mode: 0 strict, 1 bf16 (PA_FPMATH_*)
        ]  # fmt: skip
        amx_bf16 = getattr(library, "llmc_pa_amx_bf16", None)  # None: built from older sources
        if amx_bf16 is not None:
            amx_bf16.restype = ctypes.c_int
        self.amx_bf16: bool = amx_bf16 is not None and bool(amx_bf16())
        self.status_message = library.llmc_pa_status_message
        self.status_message.restype = ctypes.c_char_p
        self.status_message.argtypes = [ctypes.c_int]
        # (values, codes or out, n, cache dtype code, scale): the kernel's cache write and read.
        self.quantize = library.llmc_pa_quantize
        self.dequantize = library.llmc_pa_dequantize
        for function in (self.quantize, self.dequantize):
            function.restype = None
            function.argtypes = [ptr, ptr, i64, i32, f32]


@functools.cache
def load_library() -> _KernelLibrary:
    """Load the kernel: the built extension if it matches the source, else a cached gcc build.

    Raises:
        RuntimeError: no usable built extension, and gcc is missing or fails.
    """
    exists = all(p.exists() for p in _HASHED)
    source_sha256 = (
        hashlib.sha256(b"".join(p.read_bytes() for p in _HASHED)).hexdigest() if exists else None
    )
    for path in sorted(_DIR.glob("_paged_attention_cpu*.so")):
        library = _KernelLibrary(path)
        if source_sha256 is None or library.source_sha256 == source_sha256:
            return library
        warnings.warn(
            f"{path.name} was built from older sources; compiling the current ones into "
            "~/.cache/llmc (run `pip install -e .` to rebuild the extension)",
            stacklevel=2,
        )
    if source_sha256 is None:
        raise RuntimeError(
            f"neither the built CPU attention kernel nor all of its sources in {_DIR} were found"
        )
    return _KernelLibrary(_compile(source_sha256))


def bf16_prefill_available() -> bool:
    """Whether ``fpmath_mode="bf16"`` runs prefill tiles on AMX-BF16 here: the kernel built with
    AMX (``-march=native`` on such a host) and Linux granting this process the tile registers.
    Raises RuntimeError as :func:`load_library`."""
    return load_library().amx_bf16


def _compile(source_sha256: str) -> Path:
    """Compile the kernel's sources into one library in the cache dir, keyed by their digest and
    the flags; return its path."""
    key = hashlib.sha256(" ".join((source_sha256, *COMPILE_FLAGS)).encode()).hexdigest()[:16]
    cache_dir = cache_home()
    target = cache_dir / f"paged_attention_cpu-{key}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError(
            "the CPU paged-attention kernel is not built and no C compiler was found: "
            "run `pip install -e .` where gcc is available, or install gcc"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Why a temporary name and a rename: two processes compiling at once never load a half file.
    partial = target.with_suffix(f".{os.getpid()}.partial")
    command = [compiler, *COMPILE_FLAGS, "-shared", "-fPIC"]
    command += [f'-DLLMC_PA_SOURCE_SHA256="{source_sha256}"', "-o", str(partial)]
    command += [str(p) for p in _SOURCES]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        shown = " ".join(command)
        raise RuntimeError(f"compiling the CPU attention kernel failed:\n{shown}\n{result.stderr}")
    os.replace(partial, target)
    return target


def _check(
    name: str, array: object, dtype: np.dtype | type, ndim: int, *, rows_strided: bool = False
) -> None:
    """Raise unless ``array`` is an ndarray of ``dtype`` and ``ndim`` laid out as the kernel reads.

    ``rows_strided``: rows may be spaced freely (a column slice, such as q out of a fused QKV)
    as long as each row is contiguous; otherwise the whole array must be C-contiguous.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(array).__name__}")
    if array.dtype != dtype:
        raise TypeError(
            f"{name} must be {np.dtype(dtype)}, got {array.dtype}"
            + ("; the CPU kernel supports float32 only" if dtype is np.float32 else "")
        )
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {array.shape}")
    if rows_strided:
        if array.strides[1] != array.itemsize or array.strides[0] % array.itemsize:
            raise ValueError(f"{name} must have contiguous rows, got strides {array.strides}")
    elif not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (read in place, never copied)")


def _check_shape(name: str, array: np.ndarray, expected: tuple[int, ...]) -> None:
    if array.shape != expected:
        raise ValueError(f"{name} must have shape {expected}, got {array.shape}")


def _cache_dtype_code(dtype: np.dtype, name: str = "the KV cache") -> int:
    """The kernel's code of a KV cache dtype; ValueError unless float32, float8_e4m3fn or int8."""
    code = _CACHE_DTYPE_CODES.get(dtype)
    if code is None:
        known = ", ".join(str(d) for d in _CACHE_DTYPE_CODES)
        raise ValueError(f"{name} must be one of {known} (the kernel's cache dtypes), got {dtype}")
    return code


# Why a normal float32 scale: the kernel divides by it in float32, where a smaller one is 0.
_SCALE_RANGE = (float(np.finfo(np.float32).smallest_normal), float(np.finfo(np.float32).max))


def _check_scale(name: str, value: float) -> None:
    if not _SCALE_RANGE[0] <= value <= _SCALE_RANGE[1]:  # NaN fails too
        raise ValueError(f"{name} must be a finite positive float32 (a normal one), got {value}")


def quantize_cpu(x: np.ndarray, dtype: np.dtype | type, scale: float = 1.0) -> np.ndarray:
    """The kernel's cache write alone: ``saturate(round_half_even(x / scale))`` in ``dtype``.

    ``x``: a float32 ndarray, any shape; ``dtype``: a ``NUMPY_DTYPES`` value (float32 is a copy;
    FP8 E4M3FN saturates to +-448, int8 to [-127, 127]); ``scale`` as ``k_scale``. Returns
    a new array of ``x``'s shape. Raises ValueError for a bad ``dtype``, ``scale`` or ``x``.
    """
    code = _cache_dtype_code(np.dtype(dtype))
    _check_scale("scale", scale)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise ValueError(f"x must be a float32 numpy array, got {getattr(x, 'dtype', x)!r}")
    x, out = np.ascontiguousarray(x), np.empty(x.shape, dtype)
    load_library().quantize(x.ctypes.data, out.ctypes.data, x.size, code, scale)
    return out


def dequantize_cpu(codes: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """The kernel's cache read alone: ``float(codes) * scale`` as float32 (FP8 through a table).

    ``codes``: an ndarray of a ``NUMPY_DTYPES`` value (float32 is copied, ``scale`` unused).
    Raises ValueError for a bad dtype or ``scale``.
    """
    code = _cache_dtype_code(np.asarray(codes).dtype)
    _check_scale("scale", scale)
    codes = np.ascontiguousarray(codes)
    out = np.empty(codes.shape, np.float32)
    load_library().dequantize(codes.ctypes.data, out.ctypes.data, codes.size, code, scale)
    return out


@plugin_kernel
def paged_attention_cpu(
    inputs: PluginInputs,
    a: KernelArguments,
    *,
    out: np.ndarray | None = None,
    fpmath_mode: str = "strict",
) -> np.ndarray:
    """Write the new tokens' keys and values into the paged cache in place, then attend causally.

    Same contract and signature as
    :func:`llmc.plugins.paged_attention.reference.paged_attention_reference` (DESIGN §3), on
    numpy arrays with float32 activations. Threads: the kernel's own pool of
    sleeping workers (``LLMC_NUM_THREADS``, else ``OMP_NUM_THREADS``, else all online cores; see
    the C file for why not OpenMP); steps under ~2^18 multiply-adds run on the calling thread.

    The cache dtype is the caches' own (``llmc.engine.kv_cache.NUMPY_DTYPES``): float32 is written
    and read as is;
    ``ml_dtypes.float8_e4m3fn`` (FP8 E4M3FN of the OCP 8-bit floating point spec, Micikevicius
    et al. 2022, max 448) and int8 (symmetric, [-127, 127]) hold
    ``saturate(round_half_even(x / scale))`` and are read as ``float(q) * scale``, with one
    float32 scale for the keys and one for the values of the layer (vLLM's per-tensor
    ``k_scale``/``v_scale``).

    Args:
        q: [T, H*D] float32; rows contiguous (a column slice of a fused QKV output is fine).
        k, v: [T, KVH*D] float32; rows contiguous.
        key_cache, value_cache: [num_blocks, block_size, KVH, D], both float32, both
            float8_e4m3fn or both int8, C-contiguous; written in place, never copied.
        seq_lens: [B] int32, context length after this step. query_start_loc: [B+1] int32.
        block_tables: [B, max_blocks] int32; rows contiguous. slot_mapping: [T] int64.
        num_heads, num_kv_heads, head_dim, scale, sliding_window, logit_softcap: as in the
            reference (None = off).
        k_scale, v_scale: the quantized cache's scales (normal positive float32; unused by a
            float32 cache), in units of key (value) per quantization step.
        out: optional [T, H*D] float32 C-contiguous array to write into (must not overlap q).
        fpmath_mode: the node's ``FPMATH_ATTRIBUTE`` (``llmc.engine.plugin``): "strict"
            computes in float32; "bf16" runs prefill tiles (2 or more new tokens of a sequence)
            on AMX-BF16 tiles where the host has them: q (scaled), k, v and the softmax
            weights rounded to bfloat16, every sum float32 (elsewhere: as strict).

    Returns:
        ``out`` (or a new array), [T, H*D] float32.

    Raises:
        TypeError: an argument is not a numpy array, or (but the caches) not of the dtype above.
        ValueError: a cache dtype other than the three above (bfloat16 included) or two
            different ones, a bad scale, a wrong shape, layout or parameter, or metadata that
            points outside the cache (checked by the kernel before it writes anything).
        RuntimeError: the kernel cannot be loaded or compiled (see :func:`load_library`).
    """
    cache_dtype, out = _checked(inputs, a, out, fpmath_mode)
    q, k, v = inputs.q, inputs.k, inputs.v
    key_cache, value_cache = inputs.key_cache, inputs.value_cache
    seq_lens, block_tables = inputs.seq_lens, inputs.block_tables
    num_tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    num_blocks, block_size = key_cache.shape[:2]
    if num_tokens == 0:
        return out

    status = load_library().paged_attention(
        None,  # the kernel's own thread pool
        q.ctypes.data, q.strides[0] // 4, k.ctypes.data, k.strides[0] // 4,
        v.ctypes.data, v.strides[0] // 4, key_cache.ctypes.data, value_cache.ctypes.data,
        num_blocks, block_size, seq_lens.ctypes.data, inputs.query_start_loc.ctypes.data,
        block_tables.ctypes.data, block_tables.strides[0] // 4, block_tables.shape[1],
        inputs.slot_mapping.ctypes.data, out.ctypes.data,
        num_tokens, num_seqs, a.num_heads, a.num_kv_heads, a.head_dim,
        # Why min(): a window longer than any context is no window, and must fit a C int.
        a.scale, min(a.sliding_window or 0, 2**31 - 1), a.logit_softcap or 0.0,
        cache_dtype, a.k_scale, a.v_scale, FPMATH_MODES.index(fpmath_mode),
    )  # fmt: skip
    if status != 0:
        message = load_library().status_message(status).decode()
        raise ValueError(f"bad attention metadata: {message}")
    return out


def _checked(inputs: PluginInputs, a: KernelArguments, out, fpmath_mode: str):
    """Check ``paged_attention_cpu``'s arguments (dtypes, layouts, shapes, parameters) as its
    Raises section says; returns (the caches' dtype code, ``out`` or a new [T, H*D] float32
    array)."""
    num_heads, num_kv_heads, head_dim = a.num_heads, a.num_kv_heads, a.head_dim
    q, k, v = inputs.q, inputs.k, inputs.v
    key_cache, value_cache = inputs.key_cache, inputs.value_cache
    seq_lens, query_start_loc = inputs.seq_lens, inputs.query_start_loc
    block_tables, slot_mapping = inputs.block_tables, inputs.slot_mapping
    if num_kv_heads <= 0 or head_dim <= 0 or num_heads % num_kv_heads != 0 or num_heads <= 0:
        raise ValueError(
            f"need num_heads a positive multiple of num_kv_heads and head_dim > 0, got "
            f"num_heads={num_heads}, num_kv_heads={num_kv_heads}, head_dim={head_dim}"
        )
    if a.sliding_window is not None and a.sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1, got {a.sliding_window}")
    if a.logit_softcap is not None and not a.logit_softcap > 0:
        raise ValueError(f"logit_softcap must be None or > 0, got {a.logit_softcap}")
    _check_scale("k_scale", a.k_scale)
    _check_scale("v_scale", a.v_scale)
    if fpmath_mode not in FPMATH_MODES:
        raise ValueError(f"fpmath_mode must be one of {FPMATH_MODES}, got {fpmath_mode!r}")
    for name, array in (("q", q), ("k", k), ("v", v)):
        _check(name, array, np.float32, 2, rows_strided=True)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(cache, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(cache).__name__}")
    cache_dtype = _cache_dtype_code(key_cache.dtype, "key_cache")
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(
            f"key_cache and value_cache must have one dtype, got {key_cache.dtype} and "
            f"{value_cache.dtype}"
        )
    _check("key_cache", key_cache, key_cache.dtype, 4)
    _check("value_cache", value_cache, key_cache.dtype, 4)
    _check("seq_lens", seq_lens, np.int32, 1)
    _check("query_start_loc", query_start_loc, np.int32, 1)
    _check("block_tables", block_tables, np.int32, 2, rows_strided=True)
    _check("slot_mapping", slot_mapping, np.int64, 1)
    num_tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    num_blocks, block_size = key_cache.shape[:2]
    _check_shape("q", q, (num_tokens, num_heads * head_dim))
    _check_shape("k", k, (num_tokens, num_kv_heads * head_dim))
    _check_shape("v", v, (num_tokens, num_kv_heads * head_dim))
    _check_shape("key_cache", key_cache, (num_blocks, block_size, num_kv_heads, head_dim))
    _check_shape("value_cache", value_cache, key_cache.shape)
    _check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    _check_shape("block_tables", block_tables, (num_seqs, block_tables.shape[1]))
    _check_shape("slot_mapping", slot_mapping, (num_tokens,))
    if out is None:
        out = np.empty((num_tokens, num_heads * head_dim), dtype=np.float32)
    else:
        _check("out", out, np.float32, 2)
        _check_shape("out", out, (num_tokens, num_heads * head_dim))
    return cache_dtype, out
