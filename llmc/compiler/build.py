"""``build``: checkpoint -> ONNX with plugins -> passes -> engine directory (DESIGN §1).

One orchestrator for every backend (``backends.registry``): the target-independent stages
(``llmc.compiler.stages``: resolve -> load -> export with the passes -> quantize), then the
backend's (``backends.protocol.Backend``: lower -> report -> manifest -> finish), then publish.
Each stage is a function of the previous stage's artifact. The engine is written to a
temporary directory beside the target and renamed into place at the end, so a failed or
interrupted build never leaves a half-written engine where the runtime would find it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from pathlib import Path

from llmc.compiler.backends.onnxruntime.text_sampler import sampling_model
from llmc.compiler.backends.protocol import BuildRecord, HostPlan
from llmc.compiler.backends.registry import backend_for
from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.memory.plan import MemoryPlan, plan_memory
from llmc.compiler.quantize.search.recheck import EngineMissedTarget, check_engine_accuracy
from llmc.compiler.stages.build_stats import BuildStats
from llmc.compiler.stages.export import export
from llmc.compiler.stages.load import ResolvedModel, load, resolve
from llmc.compiler.stages.progress import BuildProgress
from llmc.compiler.stages.publish import publish_result
from llmc.compiler.stages.quantize import CalibrationTexts, Reference, quantize, read_texts
from llmc.compiler.stages.result import BuildResult
from llmc.engine.files import DRAFT_DIR, MANIFEST_NAME
from llmc.engine.manifest import parse_manifest, read_manifest, write_manifest
from llmc.engine.staged_dir import scratch_dir, staged_dir
from llmc.errors import BuildConfigError
from llmc.heap import collect_new_objects_only


def build(config: BuildConfig, progress: BuildProgress | None = None) -> BuildResult:
    """Build one engine as ``config`` says, on the backend of its target.

    ``progress`` is told each stage's start and end. Raises BuildConfigError for a target this
    host cannot build, a ``--max-seq-len`` past the model's positions or a model over the
    host's memory; ModelSourceError for a bad model path, a malformed checkpoint file or a
    config that does not match its tensors (all before any weight is read);
    CalibrationDataError for bad calibration text, FastPathError when quantized layers miss
    their kernels, TensorRTLintError for a GPU graph TensorRT would refuse,
    TensorRTUnavailableError after writing a GPU target's portable stage on a host that cannot
    build its plan, and whatever export/ORT raise for a model they cannot handle.
    """
    with collect_new_objects_only():
        return _build(config, progress)


def _build(config: BuildConfig, progress: BuildProgress | None) -> BuildResult:
    config.validate()
    backend = backend_for(config.target.arch)
    if config.quantization.draft is not None and not backend.supports_draft:
        raise BuildConfigError("--draft builds cpu engines only; build a GPU draft on its own")
    stats = BuildStats(progress.stage if progress is not None else None)
    stage = stats.stage
    # Everything that can be refused is checked before the weights are read.
    host = backend.plan_host(config)
    resolved = resolve(config.source, stage)
    config = config.for_model(resolved.source.dims)  # --max-seq-len within the model's positions
    texts = read_texts(config)
    memory = _memory_plan(config, resolved, texts, host)
    out = backend.output_dir(config, resolved.model_id, host)
    with scratch_dir(out) as work:
        model = load(resolved, stage, memory)
        graph = export(model, config.export, stage, work, memory.in_flight_bytes, host.share_tied)
        reference = Reference(model, graph, texts, sampling_model(model, graph, texts, config))
        resume = None
        for rechecks in itertools.count():
            engine_graph = quantize(reference, config, stage, host.bound_pairs, work, resume)
            try:
                with staged_dir(out) as tmp:
                    engine = backend.lower(engine_graph, tmp, config, host, stage, memory)
                    report = backend.report(engine, reference, config, stage, _headroom(stats))
                    check_engine_accuracy(
                        config.quantization.target, report.accuracy, _search(engine_graph), rechecks
                    )
                    record = BuildRecord(
                        config, model, engine_graph, engine, report, host, stats, memory
                    )
                    backend.write_manifest(record, stage)
                break
            except EngineMissedTarget as missed:
                if missed.resume is None:
                    raise
                with stage(str(missed)):  # a line in the build's log
                    resume = missed.resume
                del engine_graph, engine, report
    out = backend.finish(out, config, host, stage)
    if config.quantization.draft is not None:
        build_draft(config, out, progress)
    return publish_result(
        config.destination,
        out,
        stage,
        engine_graph.pass_report,
        engine.optimized_ops,
        engine.quantization,
        report.accuracy,
    )


def _memory_plan(
    config: BuildConfig, resolved: ResolvedModel, texts: CalibrationTexts | None, host: HostPlan
) -> MemoryPlan:
    """``plan_memory`` of this build on ``host``'s backend (raises BuildConfigError when it
    cannot fit ``--max-build-memory``)."""
    calib, quantization = config.calibration, config.quantization
    return plan_memory(
        resolved.source,
        quantization.quant,
        cpu=host.measures_engine,
        limit_gb=config.target.max_build_memory,
        spec=config.quant_spec(host.bound_pairs) if quantization.quantizes else None,
        calib_tokens=calib.calib_samples * calib.calib_seq_len,
        samples_text=texts is not None and not texts.calibration.path,
        engine_load_factor=host.engine_load_factor,
    )


def _headroom(stats: BuildStats) -> int:
    """Bytes the process may add without passing the peak RSS its earlier stages reached: what
    the provider measurement may load without raising the build's peak."""
    import psutil

    return max(0, stats.peak_rss_bytes - psutil.Process().memory_info().rss)


def _search(engine_graph) -> dict | None:
    """The ``--accuracy-target`` search's record of ``engine_graph``'s quantization, if any."""
    report = engine_graph.quant_report
    return None if report is None else report.spec.get("accuracy_target")


def build_draft(config: BuildConfig, engine_dir: Path, progress: BuildProgress | None) -> None:
    """Build the draft engine of ``config`` (its checkpoint at ``--quant`` = ``--draft``) into
    ``engine_dir/draft`` and record it, with its manifest's digest and its accuracy report
    (against the unquantized model), in the engine's manifest."""
    quantization = dataclasses.replace(
        config.quantization, quant=config.quantization.draft, draft=None, exclude=None,
        weight_only8=None, accuracy_target=None, recipe=None, weight_only8_block_size=None,
    )  # fmt: skip
    destination = dataclasses.replace(
        config.destination, output=str(engine_dir / DRAFT_DIR), registry=None
    )
    draft_config = dataclasses.replace(config, quantization=quantization, destination=destination)
    build(draft_config, progress)
    draft_manifest = engine_dir / DRAFT_DIR / MANIFEST_NAME
    raw = draft_manifest.read_bytes()  # read once: the bytes hashed are the bytes parsed
    record = {
        "path": DRAFT_DIR,
        "quant": config.quantization.draft,
        "manifest_sha256": hashlib.sha256(raw).hexdigest(),
        "accuracy_report": parse_manifest(raw, str(draft_manifest)).accuracy_report,
    }
    write_manifest(dataclasses.replace(read_manifest(engine_dir), draft=record), engine_dir)
