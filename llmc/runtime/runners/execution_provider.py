"""How an ONNX Runtime session is bound to an engine's execution provider
(``llmc.engine.provider`` says which providers there are and what each serves)."""

from __future__ import annotations

import json

from llmc.engine.provider import (
    CPU_EP,
    HYBRID,
    OPENVINO_EP,
    OPENVINO_PACKAGE,
    OPENVINO_RUNTIME,
    ProviderChoice,
    provider_version,
)
from llmc.errors import EngineError


def bind_provider(opts, choice: ProviderChoice) -> list[str] | None:
    """Attach ``choice`` to ``opts`` (``onnxruntime.SessionOptions``).

    Returns the ``providers`` argument for ``InferenceSession`` (None when the provider is bound
    through ``opts``). Raises EngineError when the OpenVINO plugin package is missing or exposes
    no CPU device on this host.
    """
    if choice.name in (CPU_EP, HYBRID):  # the hybrid's ONNX Runtime sessions are the CPU EP's
        return [CPU_EP]
    if choice.name == OPENVINO_RUNTIME:
        raise EngineError(
            f"{OPENVINO_RUNTIME} is OpenVINO's own runtime, not an ONNX Runtime execution "
            "provider: run the engine with llmc.runtime.runners.cpu_runner"
        )
    devices, reason = openvino_cpu_devices()
    if reason is not None:
        raise EngineError(
            f"this engine runs on ONNX Runtime's OpenVINO execution provider, but {reason}; "
            "rebuild it on this host (`llmc build` measures the providers that run here; "
            "--dtype float32 runs on the CPU EP)"
        )
    config = {"CPU": {"INFERENCE_PRECISION_HINT": choice.precision}}
    opts.add_provider_for_devices(devices, {"load_config": json.dumps(config)})
    return None


def openvino_cpu_devices() -> tuple[list, str | None]:
    """The OpenVINO EP's CPU devices (``onnxruntime.OrtEpDevice``), registering the plugin
    library once per process; or ``([], reason)`` saying why there are none.

    Observed on AMD EPYC hosts (AVX2, and AVX-512 with BF16) with onnxruntime 1.31.1 and the
    plugin 1.8.1: the library registers without error, yet ``get_ep_devices()`` lists only the
    CPU EP's device, so nothing here can bind the OpenVINO EP. Why: the plugin's device factory
    (``ov_factory.cc``) skips every hardware device whose vendor is not Intel, although the
    OpenVINO 2026.4 runtime it bundles lists this CPU, with BF16 (``openvino.Core``); upstream
    fix: microsoft/onnxruntime PR #31981, open. The reason then names the CPU's vendor.
    """
    import onnxruntime as ort

    try:
        import onnxruntime_ep_openvino as ov
    except ImportError:
        return [], f"{OPENVINO_PACKAGE} is not installed (pip install {OPENVINO_PACKAGE})"
    try:
        ort.register_execution_provider_library(OPENVINO_EP, ov.get_library_path())
    except Exception as e:  # a plain Fail; a second registration in a process is one too
        if "already registered" not in str(e):
            return [], f"{OPENVINO_PACKAGE} did not register with onnxruntime: {e}"
    cpu = ort.OrtHardwareDeviceType.CPU
    devices = [d for d in ort.get_ep_devices() if d.ep_name == OPENVINO_EP and d.device.type == cpu]
    if not devices:
        version = provider_version(ProviderChoice(OPENVINO_EP, "f32"))
        reason = f"{OPENVINO_PACKAGE} {version} exposes no CPU device on this host"
        vendors = {d.device.vendor for d in ort.get_ep_devices() if d.device.type == cpu}
        if vendors and not any("Intel" in v for v in vendors):
            reason += (
                " (its device factory claims Intel CPUs only; ONNX Runtime reports this CPU's "
                f"vendor as {', '.join(sorted(vendors))})"
            )
        return [], reason
    return devices, None
