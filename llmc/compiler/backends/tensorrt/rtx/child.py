"""The TensorRT for RTX build, in the child process ``plan_build.build_plan_rtx`` starts with the
libraries' folder on ``LD_LIBRARY_PATH``: ``python -m llmc.compiler.backends.tensorrt.rtx.child``
reads one request (JSON) on stdin, builds the plan and writes the manifest's record to the
request's ``result`` file. Progress goes to stdout as ``llmc-tick DONE TOTAL`` lines; TensorRT's
log and any error to stderr; exit code 0 when the plan is written, 1 when TensorRT refused the
graph, 130 when the build was cancelled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmc.compiler.backends.tensorrt.builder import (
    PlanRequest,
    ShapeRange,
    TensorRTBuildError,
    build_network_plan,
)

TICK_PREFIX = "llmc-tick"


def request_to_json(request: PlanRequest, compute_capability: str, result: Path) -> str:
    """The child's stdin for ``request`` built for ``compute_capability`` ("SM89")."""
    profile = {
        name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)}
        for name, r in request.profile.items()
    }
    return json.dumps(
        {
            "onnx_path": str(request.onnx_path),
            "plan_path": str(request.plan_path),
            "profile": profile,
            "builder_opt_level": request.builder_opt_level,
            "timing_cache": request.timing_cache,
            "compute_capability": compute_capability,
            "result": str(result),
        }
    )


def _request(text: str) -> tuple[PlanRequest, str, Path]:
    d = json.loads(text)
    profile = {
        name: ShapeRange(tuple(r["min"]), tuple(r["opt"]), tuple(r["max"]))
        for name, r in d["profile"].items()
    }
    request = PlanRequest(
        Path(d["onnx_path"]),
        Path(d["plan_path"]),
        profile,
        d["builder_opt_level"],
        d["timing_cache"],
    )
    return request, d["compute_capability"], Path(d["result"])


def _tick(done: int, total: int) -> None:
    print(f"{TICK_PREFIX} {done} {total}", flush=True)


def main() -> int:
    """Build the plan stdin asks for; the exit code (module docstring)."""
    request, capability, result = _request(sys.stdin.read())
    import onnxruntime_ep_nv_tensorrt_rtx  # noqa: F401  (makes the SONAME links)
    import tensorrt_rtx_bindings as trt

    from llmc.plugins.paged_attention import trt_v3

    logger = trt.Logger(trt.Logger.WARNING)
    creator = trt_v3.register(trt)  # noqa: F841  (the registry holds a reference only)

    def configure(config) -> None:
        # Without a compute capability the builder logs CUDA errors and the target is unclear.
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, capability), 0)

    try:
        record = build_network_plan(trt, logger, ("STRONGLY_TYPED",), configure, request, _tick)
    except TensorRTBuildError as error:
        print(str(error), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    result.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
