"""Build a TensorRT for RTX plan from a portable stage's graph, on any host (no GPU).

The parse and build run in a child process (``child.py``) started with the libraries' folder on
``LD_LIBRARY_PATH`` (``libraries.child_environment``): the parser ``dlopen``s
``libtensorrt_rtx.so`` when it adds the PagedAttention plugin layer, a name glibc resolves
through that variable, read only at process start (in this process the build aborts with
``terminate called without an active exception``). The plan's kernels are compiled for the
user's GPU when it first loads the plan (TensorRT for RTX's "CPU-only AOT" flow).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from llmc.compiler.backends.tensorrt.builder import PlanRequest, TensorRTBuildError
from llmc.compiler.backends.tensorrt.rtx.child import TICK_PREFIX, request_to_json
from llmc.engine.gpu import arch_capability
from llmc.engine.tensorrt_rtx import RTX_ARCHES, child_environment

#: Lines of the child's log kept for an error message.
_LOG_TAIL = 30
_CHILD = "llmc.compiler.backends.tensorrt.rtx.child"


def compute_capability(arch: str) -> str:
    """TensorRT for RTX's ``trt.ComputeCapability`` member of ``arch``: "sm89" -> "SM89"."""
    major, minor = arch_capability(arch)
    return f"SM{major}{minor}"


def build_plan_rtx(request: PlanRequest, arch: str, tick=None) -> dict:
    """Build ``request``'s plan for ``arch`` with TensorRT for RTX in a child process; returns
    the manifest's ``tensorrt`` record. Raises TensorRTBuildError (the parser or builder
    refused the graph: their messages; or the child died), ValueError for an arch it does not
    target, FileNotFoundError without the libraries, KeyboardInterrupt (cancelled)."""
    if arch not in RTX_ARCHES:
        raise ValueError(f"TensorRT for RTX builds {', '.join(RTX_ARCHES)}, not {arch}")
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "record.json"
        log = Path(tmp) / "log.txt"
        stdin = request_to_json(request, compute_capability(arch), result)
        code = _run_child(stdin, log, tick)
        if code == 130:
            raise KeyboardInterrupt("TensorRT for RTX build cancelled")
        if code != 0 or not result.is_file():
            tail = log.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
            raise TensorRTBuildError(
                f"TensorRT for RTX could not build {request.onnx_path} for {arch} (exit code "
                f"{code}):\n  " + "\n  ".join(tail)
            )
        return json.loads(result.read_text())


def _run_child(stdin: str, log: Path, tick) -> int:
    """Run the child with ``stdin``, its stderr and stray stdout into ``log``, its progress
    lines to ``tick``; returns its exit code."""
    with log.open("w") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-m", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=child_environment(),
            text=True,
        )
        try:
            child.stdin.write(stdin)
            child.stdin.close()
            for line in child.stdout:
                if line.startswith(TICK_PREFIX) and tick is not None:
                    done, total = (int(x) for x in line.split()[1:3])
                    tick(done, total)
                elif not line.startswith(TICK_PREFIX):
                    log_file.write(line)
            return child.wait()
        except BaseException:
            child.kill()
            child.wait()
            raise
