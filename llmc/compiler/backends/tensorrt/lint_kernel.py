"""TensorRT lint of the AOT paged-attention kernel a stage will be built with (see ``lint.py``):

- ``smem``: the Triton kernel's dynamic shared memory, computed from its tile config for each
  plugin node's heads, head dim and dtype (``triton_tiles.shared_memory_bytes``), against 48 KB
  for an AOT kernel (TensorRT's launch is not known to opt in: ``trt_aot.aot_block_n`` must find
  a tile that fits, as ``compile_aot`` will use it) or the target's per-block maximum for a JIT
  one (Triton's launcher opts in); sources in ``trt_aot.py``: CUDA C++ Programming Guide
  ("Shared Memory"; "Technical Specifications per Compute Capability"), triton ``driver.c``.
- ``ptx``: the PTX ISA the stage records (``plugin_io.PTX_ISA_KEY``) against the newest ISA the
  CUDA of every TensorRT 11 build reads and the oldest the target needs (PTX ISA release notes;
  triton ``compiler.py`` ``make_ptx``), and against what this llmc's AOT compile writes.

Per-target checks: nothing is reported without a GPU target.
"""

from __future__ import annotations

import onnx

from llmc.compiler.backends.tensorrt.lint_view import Finding, GraphView, node_finding
from llmc.compiler.backends.tensorrt.plugin_io import PTX_ISA_KEY, metadata
from llmc.engine.plugin import PluginAttributes, plugin_nodes
from llmc.engine.targets import TARGETS
from llmc.engine.targets.sm import SmTarget
from llmc.errors import LlmcError
from llmc.plugins.paged_attention import trt_aot
from llmc.plugins.paged_attention.trt_plugin import AOT_ATTRIBUTE

_DTYPES = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16"}
SMALLEST_BLOCK_N = 16


def check_kernels(view: GraphView, target: str | None) -> list[Finding]:
    """Findings about the plugin nodes' AOT kernels on ``target`` (e.g. "sm90")."""
    nodes = plugin_nodes(view.model)
    if not nodes or target is None:
        return []
    found = TARGETS.get(target)
    if found is None:
        known = ", ".join(TARGETS)
        return [Finding("error", "smem", None, None, f"unknown target {target}; known: {known}")]
    if not isinstance(found, SmTarget):
        return []  # no GPU: no AOT kernel runs on it
    arch = found.sm
    if arch not in trt_aot.MAX_SHARED_MEMORY:
        return [Finding("error", "smem", None, None, f"no shared-memory limit known for {target}")]
    out = _ptx(view.model, arch)
    for n in nodes:
        out += _shared_memory(view, n, arch)
    return out


def kernel_shared_memory(attributes: PluginAttributes, dtype: str, block_n: int) -> int:
    """Dynamic shared memory, bytes, of the Triton kernel for one node at ``block_n``."""
    from llmc.plugins.paged_attention import triton_tiles

    config = triton_tiles.kernel_config(
        attributes.num_heads, attributes.num_kv_heads, attributes.head_dim, block_n=block_n
    )
    return triton_tiles.shared_memory_bytes(attributes.head_dim, dtype, config)


def _shared_memory(view: GraphView, n: onnx.NodeProto, arch: int) -> list[Finding]:
    try:
        attributes = PluginAttributes.from_node(n)
    except LlmcError:
        return []  # reported under "plugin"
    dtype = _DTYPES.get(view.type_name(n.input[0]) or "")
    if dtype is None:
        return []  # reported under "plugin" / "types"
    aot = next((a.i for a in n.attribute if a.name == AOT_ATTRIBUTE), 1)
    if aot and trt_aot.aot_block_n(attributes, dtype, arch) is not None:
        return []
    limit = trt_aot.shared_memory_limit(arch, opted_in=not aot)
    need = kernel_shared_memory(attributes, dtype, SMALLEST_BLOCK_N)
    if need <= limit:
        return []
    how = "an AOT launch has no opt-in above 48 KB" if aot else f"sm{arch}'s per-block maximum"
    return [
        node_finding(n)(
            "smem",
            f"the Triton kernel needs {need} B of dynamic shared memory even at its smallest tile "
            f"(block_n {SMALLEST_BLOCK_N}, head_dim {attributes.head_dim}, {dtype}); it may use "
            f"{limit} B ({how}): use 16-bit activations",
        )
    ]


def _ptx(model: onnx.ModelProto, arch: int) -> list[Finding]:
    def error(message: str) -> list[Finding]:
        return [Finding("error", "ptx", None, None, message)]

    recorded = metadata(model).get(PTX_ISA_KEY)
    ceiling, floor = trt_aot.ptx_isa_ceiling(), trt_aot.MIN_PTX_ISA[arch]
    releases = ", ".join(f"{a}.{b}" for a, b in trt_aot.TENSORRT_CUDA_RELEASES)
    if recorded is None:
        return error(
            f"the stage does not pin the AOT kernel's PTX ISA ({PTX_ISA_KEY}); unpinned, "
            "Triton writes its own ptxas's ISA (9.4 for sm90+ with triton 3.9), newer than "
            f"TensorRT 11's CUDA ({releases}) reads"
        )
    try:
        major, minor = (int(x) for x in recorded.split("."))
    except ValueError:
        return error(f"{PTX_ISA_KEY}={recorded!r} is not a version like 8.7")
    isa = (major, minor)
    if isa > ceiling:
        return error(
            f"PTX ISA {recorded} is newer than {ceiling[0]}.{ceiling[1]}, the newest every CUDA "
            f"TensorRT 11 is built for ({releases}) reads"
        )
    if isa < floor:
        return error(f"PTX ISA {recorded} predates sm{arch} (needs {floor[0]}.{floor[1]})")
    if isa != trt_aot.PTX_ISA:
        pinned = "{}.{}".format(*trt_aot.PTX_ISA)
        return error(f"the stage pins PTX ISA {recorded}; this llmc's AOT compile writes {pinned}")
    return []
