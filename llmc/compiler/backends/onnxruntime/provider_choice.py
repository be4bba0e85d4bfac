"""Choose the provider of a CPU engine by measurement (DESIGN §9-10).

The candidates follow the engine's dtype. float32 engines, quantized or not: the CPU EP (f32),
the OpenVINO EP (f32) and, for quantized engines, the hybrid (the CPU EP for steps of few
tokens, OpenVINO's runtime for large ones, ``llmc.runtime.runners.hybrid_runner``). Under
``auto`` the two OpenVINO candidates are measured only when what they load
(``OPENVINO_LOAD_FACTOR`` and ``HYBRID_LOAD_FACTOR`` times the engine's bytes: OpenVINO
decompresses 4- and 8-bit weights to float32) stays under the peak RSS the build already reached
(on an Intel host, where the EP has a CPU device, loading a 2.3 GB 3B int4 engine in it holds
9.1 GB). bfloat16 engines: the OpenVINO EP (bf16) and OpenVINO's runtime on the segments (bf16;
``llmc.runtime.runners.openvino_runner``, it runs on AMD CPUs too), since the CPU EP has no bf16
GEMM. The engine graph is lowered once, by dtype (``lower.lower_to_cpu``), and every candidate
runs that same graph: what is measured is what ships.

For each candidate, ``select_provider`` records why it cannot run here (package missing, no CPU
device, the graph does not load) or measures it: the engine through its runner
(``llmc.runtime.runners.cpu_runner``), on the steps of ``provider_timing`` (decode at batch 1
and 16, a 128-token prefill; one warmup, median of 3). A candidate is rejected when its logits
differ from the CPU EP's (f32) by more than ``TOLERANCE`` of its precision
(``QUANTIZED_TOLERANCE`` for a quantized engine), relative to the logits' scale. Score: the
geometric mean of its median step times in ms, so halving any one step's time counts the same.
The lowest score wins, except that a later candidate must beat an earlier one by more than
``MARGIN`` (noise on this 2-core host is about ±10%), so ties go to the CPU EP, which needs no
plugin. On Gemma 3 270M this costs a few seconds per available candidate."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmc.compiler.backends.onnxruntime.provider_timing import (
    ProbeSteps,
    max_relative_diff,
    time_steps,
)
from llmc.engine.provider import (
    CPU_EP,
    HYBRID,
    OPENVINO_EP,
    OPENVINO_RUNTIME,
    PROVIDERS,
    ProviderChoice,
)
from llmc.errors import BuildConfigError
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.execution_provider import openvino_cpu_devices
from llmc.runtime.runners.openvino_runner import OPENVINO_LOAD_FACTOR, openvino_available

#: Largest accepted max|logits - cpu_ep| / max|cpu_ep|, by compute precision. f32: the OpenVINO
#: EP measured 2e-5 on Gemma 3 270M, 1e-3 leaves room for summation order; bf16: measured up to
#: ~0.1 there (8-bit mantissa), 0.15 rejects only a provider computing something else.
TOLERANCE = {"f32": 1e-3, "bf16": 0.15}
#: The same for a quantized engine: its weight-only kernels quantize activations to 8 bits
#: inside the product (``MatMulNBits`` at accuracy level 4, OpenVINO's dynamic quantization),
#: each runtime its own way. Measured between the two on Gemma 3 270M int4: 0.053 (128-token
#: prefill) to 0.075 (decode), top-1 equal; the accuracy report measures the chosen one.
QUANTIZED_TOLERANCE = 0.15
#: Resident bytes per engine weight byte the hybrid adds while measured (``auto`` measures it
#: for quantized engines): ONNX Runtime's session with its packed weights and step buffers plus
#: OpenVINO's compiled segments. Measured (``benchmarks/provider_load.py``, AMD EPYC host,
#: openvino 2026.4.1) on Gemma 3 270M's quantized engines: 4.9x to 5.2x (the fp8
#: ``--accuracy-target`` engine, 0.44 GB, added 2.17 GB), where ONNX Runtime's copy plus
#: ``OPENVINO_LOAD_FACTOR`` (3.5x) let that build pass its peak by 0.45 GB.
HYBRID_LOAD_FACTOR = 5.5
MARGIN = 0.05
PENDING, ACCEPTED, REJECTED, UNAVAILABLE = "pending", "accepted", "rejected", "unavailable"


@dataclass(frozen=True)
class CandidateResult:
    """One candidate provider and what became of it.

    ``status``: "unavailable" (cannot run on this host; ``reason`` says why), "pending" (runs
    here, not measured yet), "rejected" (failed to run, or disagreed with the CPU EP;
    ``reason``), or "accepted". ``step_ms``: median
    wall time per probe step in ms; ``score_ms``: their geometric mean; ``max_rel_diff``: its
    logits' largest difference from the CPU EP's relative to their scale, with ``tolerance``.
    """

    provider: str
    precision: str  # "f32" | "bf16"
    status: str
    reason: str | None = None
    max_rel_diff: float | None = None
    tolerance: float | None = None
    step_ms: dict[str, float] = field(default_factory=dict)
    score_ms: float | None = None

    @property
    def choice(self) -> ProviderChoice:
        return ProviderChoice(self.provider, self.precision)

    def format(self) -> str:
        """One line: ``OpenVINOExecutionProvider bf16: accepted, score 41.2 ms (...)``."""
        head = f"{self.provider} {self.precision}: {self.status}"
        if self.score_ms is not None:
            steps = ", ".join(f"{k} {v:.2f}" for k, v in self.step_ms.items())
            head += f", score {self.score_ms:.2f} ms ({steps})"
        if self.max_rel_diff is not None:
            head += f", logits rel diff {self.max_rel_diff:.1e} (max {self.tolerance:.0e})"
        return head + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class ProviderSelection:
    """How an engine's execution provider was chosen: ``mode`` ("auto", "cpu", "openvino"), the
    winner, and every candidate in preference order (``manifest.provider_selection``)."""

    mode: str
    provider: str
    precision: str
    candidates: list[CandidateResult]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ProviderSelection:
        candidates = [CandidateResult(**c) for c in d["candidates"]]
        return cls(d["mode"], d["provider"], d["precision"], candidates)

    def format(self) -> str:
        lines = [f"provider selection (--execution-provider {self.mode}):"]
        return "\n".join(lines + [f"  {c.format()}" for c in self.candidates])


def candidates(
    dtype: str,
    mode: str = "auto",
    memory: tuple[int, int] | None = None,
    quantized: bool = False,
) -> list[CandidateResult]:
    """The candidates of a ``dtype`` engine under ``mode``, in preference order, each
    "unavailable" with a reason or "pending" (runs here, not measured yet). ``auto`` measures
    the hybrid for a ``quantized`` engine only (its large steps would run OpenVINO's float32
    kernels otherwise, slower than the CPU EP's here). ``memory``: (the engine's bytes, bytes
    the build may add without raising its peak RSS); with it, ``auto`` measures a float32
    engine's OpenVINO candidates (the EP, the hybrid) only when what they load fits:
    ``OPENVINO_LOAD_FACTOR`` and ``HYBRID_LOAD_FACTOR`` times the engine's bytes (the CPU EP,
    always measured, stays the fallback)."""

    precision = "bf16" if dtype == "bfloat16" else "f32"
    # OpenVINO's runtime alone is a bf16 candidate only: at f32 it was slower than the CPU EP
    # on Gemma 3 270M's decode and holds 2.5x the engine's bytes (``OPENVINO_LOAD_FACTOR``).
    names = [OPENVINO_EP, OPENVINO_RUNTIME]
    if precision == "f32":
        names = [CPU_EP, OPENVINO_EP, *([HYBRID] if quantized or mode != "auto" else [])]
    wanted = names if mode == "auto" else [PROVIDERS[mode]]
    load_factor = {OPENVINO_EP: OPENVINO_LOAD_FACTOR, HYBRID: HYBRID_LOAD_FACTOR}
    out = []
    for name in (n for n in names if n in wanted):
        reason = _unavailable(name)
        guarded = mode == "auto" and precision == "f32" and name in load_factor
        if reason is None and guarded and memory is not None:
            need, allowed = int(memory[0] * load_factor[name]), memory[1]
            if need > allowed:
                flag = next(k for k, v in PROVIDERS.items() if v == name)
                reason = (
                    f"loading the engine in OpenVINO (~{need / 1e9:.1f} GB) would raise the "
                    f"build's peak RSS (headroom {allowed / 1e9:.1f} GB); "
                    f"--execution-provider {flag} measures it anyway"
                )
        out.append(CandidateResult(name, precision, UNAVAILABLE if reason else PENDING, reason))
    return out


def check_requested(dtype: str, mode: str) -> None:
    """Before any build work: raise BuildConfigError unless some candidate runs on this host
    (the message names each candidate and why it cannot)."""
    found = candidates(dtype, mode)
    if not any(c.status == PENDING for c in found):
        raise BuildConfigError(_none_usable(dtype, mode, found))


def choose(results: list[CandidateResult]) -> CandidateResult:
    """The winner among ``results`` (preference order): the accepted candidate with the lowest
    ``score_ms``, where a later one must beat an earlier one by more than ``MARGIN``. Raises
    ValueError when none is accepted."""
    best: CandidateResult | None = None
    for r in results:
        if r.status != ACCEPTED or r.score_ms is None:
            continue
        if best is None or r.score_ms < best.score_ms * (1.0 - MARGIN):
            best = r
    if best is None:
        raise ValueError("no accepted candidate")
    return best


def judge(
    candidate: CandidateResult, step_ms: dict[str, float], rel_diff: float, quantized: bool = False
) -> CandidateResult:
    """``candidate`` measured: accepted with its score, or rejected when ``rel_diff`` exceeds
    the tolerance of its precision (of a ``quantized`` engine: ``QUANTIZED_TOLERANCE`` at
    least)."""
    tolerance = TOLERANCE[candidate.precision]
    if quantized:
        tolerance = max(tolerance, QUANTIZED_TOLERANCE)
    score = math.exp(sum(math.log(max(t, 1e-6)) for t in step_ms.values()) / len(step_ms))
    ok = rel_diff <= tolerance
    reason = None if ok else "logits disagree with the CPU EP's beyond the tolerance"
    return CandidateResult(
        candidate.provider,
        candidate.precision,
        ACCEPTED if ok else REJECTED,
        reason,
        rel_diff,
        tolerance,
        dict(step_ms),
        score,
    )


def select_provider(
    engine_dir: Path,
    dtype: str,
    mode: str,
    probe: ProbeSteps,
    threads: int = 2,
    quantized: bool = False,
    memory_allowed: int | None = None,
) -> ProviderSelection:
    """Measure the candidates of a ``dtype`` engine under ``mode`` on the built engine in
    ``engine_dir``, on the steps of ``probe`` (``provider_timing.probe_steps``), and choose one.
    ``quantized``: the engine has quantized weights (``judge``); ``memory_allowed``: bytes
    the measurement may add without raising the build's peak RSS (None: no bound), which
    decides whether ``auto`` measures the OpenVINO candidates of a float32 engine
    (``candidates``).

    Raises BuildConfigError when no candidate is accepted (the message lists each and why).
    """

    memory = None
    if memory_allowed is not None:
        weights = sum(f.stat().st_size for f in engine_dir.rglob("*") if f.is_file())
        memory = (weights, memory_allowed)
    reference = None  # the CPU EP's (f32) warmup logits per step
    results = []
    for c in candidates(dtype, mode, memory, quantized):
        if c.status == UNAVAILABLE:
            results.append(c)
            continue
        if reference is None and c.provider != CPU_EP:
            runner = _runner(engine_dir, probe, threads, ProviderChoice(CPU_EP, "f32"))
            reference, _ = time_steps(runner, probe, repeats=0)
            del runner
        try:
            runner = _runner(engine_dir, probe, threads, c.choice)
            logits, step_ms = time_steps(runner, probe)
            del runner
        except Exception as e:  # an ORT or plugin error: this provider cannot run the graph
            if c.provider == CPU_EP:  # the reference: a failure here is a build bug, not a choice
                raise
            first = (str(e).strip().splitlines() or [""])[0][:300]
            results.append(
                CandidateResult(c.provider, c.precision, REJECTED, f"failed to run: {first}")
            )
            continue
        if reference is None:  # the CPU EP itself is the reference
            reference = logits
        results.append(judge(c, step_ms, max_relative_diff(logits, reference), quantized))
    try:
        winner = choose(results)
    except ValueError:
        raise BuildConfigError(_none_usable(dtype, mode, results)) from None
    return ProviderSelection(mode, winner.provider, winner.precision, results)


def _unavailable(name: str) -> str | None:
    """Why provider ``name`` cannot run on this host, or None."""
    if name == OPENVINO_EP:
        return openvino_cpu_devices()[1]
    if name in (OPENVINO_RUNTIME, HYBRID):
        return openvino_available()
    return None


def _runner(engine_dir: Path, probe: ProbeSteps, threads: int, choice: ProviderChoice):

    return cpu_runner(engine_dir, probe.num_blocks, threads, choice)


def _none_usable(dtype: str, mode: str, results: list[CandidateResult]) -> str:
    why = "; ".join(c.format() for c in results) or "none"
    todo = "pip install openvino, or build with --dtype float32 (it runs on the CPU EP)"
    if dtype == "float32":
        todo = "use --execution-provider cpu" if mode != "cpu" else "report this as a bug"
    return (
        f"no provider can run this --dtype {dtype} engine here "
        f"(--execution-provider {mode}): {why}; {todo}"
    )
