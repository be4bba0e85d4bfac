"""``llmc inspect PATH``: what an engine, a portable stage or an ONNX file is, and its lint.

- a portable stage (``stage.json``): its build facts, and the TensorRT lint of ``model.onnx``
  run now;
- a TensorRT engine directory (``manifest.json``, backend tensorrt): its manifest facts and the
  lint recorded when its stage was checked (the plan itself is opaque without TensorRT);
- a CPU engine: its manifest facts; the TensorRT lint does not apply (ONNX Runtime graphs);
- an ``.onnx`` file: the TensorRT lint of that graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmc.compiler.backends.onnxruntime.provider_choice import ProviderSelection
from llmc.compiler.backends.tensorrt.lint import LintReport, lint_file
from llmc.engine import stage as st
from llmc.engine.manifest import read_manifest
from llmc.engine.targets.sm import SM_BACKENDS
from llmc.errors import EngineNotFoundError


@dataclass
class Inspection:
    """What ``inspect_path`` found: the kind of artifact, facts to print, and the lint (None
    when it does not apply)."""

    path: str
    kind: str  # "stage" | "tensorrt-engine" | "cpu-engine" | "onnx"
    facts: dict = field(default_factory=dict)
    lint: LintReport | None = None
    recorded_lint: dict | None = None  # TensorRT engines: the lint stored in the manifest
    provider_selection: dict | None = None  # CPU engines: how the execution provider was chosen

    @property
    def passed(self) -> bool:
        if self.lint is not None:
            return self.lint.passed
        return self.recorded_lint is None or bool(self.recorded_lint.get("passed"))

    def format(self) -> str:
        lines = [f"{self.path}: {self.kind}"]
        lines += [f"  {k}: {v}" for k, v in self.facts.items()]
        if self.provider_selection is not None:
            text = ProviderSelection.from_dict(self.provider_selection).format()
            lines += [f"  {line}" for line in text.splitlines()]
        if self.lint is not None:
            lines.append(self.lint.format())
        elif self.recorded_lint is not None:
            r = self.recorded_lint
            lines.append(
                f"TensorRT lint (recorded at build) {'passed' if r.get('passed') else 'FAILED'}: "
                f"{r.get('errors')} errors, {r.get('warnings')} warnings"
            )
        else:
            lines.append("TensorRT lint: not applicable (ONNX Runtime engine)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        lint = self.lint.to_dict() if self.lint is not None else self.recorded_lint
        out = {"path": self.path, "kind": self.kind, "facts": self.facts, "lint": lint}
        return out | {"provider_selection": self.provider_selection}


_FACTS = ("model_id", "target", "dtype", "quant", "kv_cache_dtype", "max_seq_len")
_FACTS += ("max_num_tokens", "max_batch", "block_size", "num_layers", "plugin_versions")


def inspect_path(path: str | Path, target: str | None = None) -> Inspection:
    """Inspect ``path`` (see the module doc). ``target`` overrides the arch the lint checks
    (default: the artifact's own target; none for a bare ONNX file). Raises
    EngineNotFoundError for a path that is none of these, StageError / EngineCorruptError for a
    damaged stage or manifest."""

    p = Path(path)
    if p.is_file() and p.suffix == ".onnx":
        return Inspection(str(p), "onnx", lint=lint_file(p, target))
    if (p / st.STAGE_NAME).is_file():
        m = st.read_stage(p, verify=False)
        facts = {k: getattr(m, k) for k in _FACTS} | {"source": m.source}
        if m.quantization:
            facts["quantized"] = m.quantization.get("counts")
        facts["calibration_stats"] = m.calibration_stats
        lint = lint_file(p / st.MODEL_FILE, target or m.target)
        return Inspection(str(p), "stage", facts, lint)
    if (p / "manifest.json").is_file():
        m = read_manifest(p)
        facts = {k: getattr(m, k) for k in _FACTS} | {"backend": m.backend}
        facts["backend_version"] = m.backend_version
        if m.backend not in SM_BACKENDS:
            facts["execution_provider"] = f"{m.execution_provider} {m.execution_precision}"
            return Inspection(str(p), "cpu-engine", facts, provider_selection=m.provider_selection)
        trt = m.tensorrt or {}
        keys = ("builder", "compute_capability", "built_on", "kernels", "cuda_version")
        for key in (*keys, "hardware_compatibility", "plan"):
            if trt.get(key) is not None:  # each builder records its own
                facts[key] = trt[key]
        return Inspection(str(p), "tensorrt-engine", facts, recorded_lint=trt.get("lint"))
    raise EngineNotFoundError(
        f"{p} is not an engine directory, a portable stage or an .onnx file; give one of those"
    )
