"""The ``tensorrt-rtx`` backend: ``--arch sm86|sm89|sm120`` engines built by TensorRT for RTX.

The same portable stage as TensorRT 11's (``TensorRTBackend``: lowering, lint, stage files); the
plan is built on this host, GPU or not, in a child process (``plan_build``), its kernels
compiled on the user's GPU when it first loads the plan.
"""

from __future__ import annotations

from llmc.compiler.backends.tensorrt.backend import TensorRTBackend
from llmc.compiler.backends.tensorrt.flavour import TENSORRT_RTX, PlanFlavour


class TensorRTRtxBackend(TensorRTBackend):
    """``--arch sm86|sm89|sm120``: the stage, then a TensorRT for RTX plan on this host."""

    name = "tensorrt-rtx"
    flavour: PlanFlavour = TENSORRT_RTX
