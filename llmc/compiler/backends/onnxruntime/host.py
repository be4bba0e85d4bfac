"""What a cpu engine needs of the host it is built on: the ISA features its graph is laid out
for, and the int8 weight form this host's GEMM runs exactly."""

from __future__ import annotations

from dataclasses import dataclass

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.quantize.formats import FORMATS
from llmc.engine.isa import detect_host_isa
from llmc.engine.plugin import engine_attention_fpmath
from llmc.engine.provider import ProviderChoice, provider_for_dtype
from llmc.errors import BuildConfigError
from llmc.plugins.int8_matmul import block_int8_matmul_isa
from llmc.plugins.paged_attention import ort_op


@dataclass(frozen=True)
class CpuPlan:
    """How a cpu engine is built on this host: ``isa`` the features it will require (recorded
    in the manifest), ``arch`` the machine ("x86_64", "aarch64"), ``layout`` the graph form and
    precision lowering writes for the dtype (the provider that runs it is measured later),
    ``bound_pairs`` whether int8 weight pairs stay within 128 (no VNNI here), ``block_int8``
    whether 8-bit weight-only layers run on llmc's int8 kernel (``rewrites.int8_matmul``: VNNI
    or AVX2 tiles), and
    ``llmc_norms`` whether the single graph's RMS norms run on llmc's kernel (``rewrites.rms_norm``;
    the custom-op library is built), and ``attention_fpmath`` the PagedAttention nodes'
    ``fpmath_mode`` (``llmc.engine.plugin.FPMATH_ATTRIBUTE``): "bf16" for quantized and bf16
    builds, whose accuracy report measures what the kernel then computes (prefill on AMX-BF16
    tiles where the host has them), "strict" for float32 ones."""

    isa: list[str]
    arch: str
    layout: ProviderChoice
    bound_pairs: bool
    block_int8: bool = False
    llmc_norms: bool = False
    attention_fpmath: str = "strict"


def plan_cpu(config: BuildConfig) -> CpuPlan:
    """The ``CpuPlan`` of ``config`` on this host. Raises BuildConfigError when the dtype needs
    an ISA feature this host does not run."""
    host = detect_host_isa()
    layout = provider_for_dtype(config.source.dtype)
    isa = engine_isa(host.features, layout, config.quantization.quant)
    missing = [f for f in isa if f not in host.features]
    if missing:
        raise BuildConfigError(
            f"--dtype {config.source.dtype} on cpu needs {', '.join(missing)}, which this host "
            f"({host.name}) does not run; build with --dtype float32"
        )
    kernel_isa = block_int8_matmul_isa(host.features)
    block_int8 = config.quantization.quant != "none" and kernel_isa is not None
    if block_int8 and kernel_isa not in isa:
        isa.append(kernel_isa)
    llmc_norms = ort_op.library_path() is not None
    return CpuPlan(
        isa,
        host.arch,
        layout,
        int8_bound_pairs(host.features),
        block_int8,
        llmc_norms,
        engine_attention_fpmath(config.quantization.quant, str(config.source.dtype)),
    )


def int8_bound_pairs(host_features: tuple[str, ...]) -> bool:
    """Whether int8 W8A8 weights need adjacent pairs bounded on this host: ORT's int8 GEMM
    without AVX-512 VNNI saturates on plain 8-bit weights (``llmc.quant.grids``)."""
    return "avx512-vnni" not in host_features


def engine_isa(
    host_features: tuple[str, ...], choice: ProviderChoice, quant: str = "none"
) -> list[str]:
    """The ISA features a CPU engine depends on: the SIMD width ORT laid its graph out for,
    AVX-512 BF16 for bf16 compute, and what the ``quant`` format needs (``cpu_isa``: AVX-512
    VNNI for int8 W8A8 with full 8-bit weights).

    ORT's optimizer picks blocked layouts by vector width (AVX-512 vs AVX2); its kernels dispatch
    at run time. Without VNNI, ORT's int8 GEMM saturates on plain 8-bit weights, so an int8
    engine built on a VNNI host requires VNNI, and one built elsewhere bounds its weight pairs
    so that it runs exactly anywhere (``llmc.quant.grids``).
    """
    width = next((w for w in ("avx512", "avx2", "neon") if w in host_features), None)
    required = [width] if width else []
    if choice.precision == "bf16":
        required.append("avx512-bf16")
    required += FORMATS[quant].cpu_isa(host_features)
    return required
