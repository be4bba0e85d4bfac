"""``llmc verify``: check a built engine against the unquantized model it was built from.

The reference is rebuilt from the engine manifest's source checkpoint (its digest must match the
manifest) as the unquantized engine graph, written to a work directory and run one segment at a
time (``reference_run``): verifying an engine holds one segment of the float model, never the
whole of it. Two checks run on it:

1. The accuracy report (``llmc.calibration.accuracy``) on held-out text: ``--data`` (its held-out
   part), else the file the build's report names if it still exists, else text sampled from the
   unquantized graph with the held-out seed (the build's sampler and text cache). The engine is
   loaded after the reference has run and scored against its logits, as in a build.
2. Per segment, Polygraphy's comparator (``OnnxrtRunner`` + ``Comparator.compare_accuracy``, as
   TensorRT users run it): the reference's run of the first window keeps every tensor crossing a
   segment boundary; each engine segment runs on the unquantized graph's inputs of it and its
   outputs are compared with the unquantized graph's, so an error shows up in the segment that
   makes it instead of piling up through the layers. Engine segments and the unquantized
   graph's segments share their boundary tensor names because both are cut by
   ``split_at_plugins`` from the same export, except where the exporter names tensors
   differently from run to run (``match_names`` re-matches those by value and the result lists
   them).

The verdict is Polygraphy's on the logits segment at the given tolerances. Its elementwise check
fails an element only when it exceeds both ``atol`` and ``rtol`` (relative to the reference). The
defaults (1e-3) leave a float32 engine a wide margin (measured on Gemma 3 270M: every segment's
outputs equal the unquantized graph's exactly); quantized and bfloat16 engines differ by design
and need looser tolerances, chosen from the max errors this check reports and judged together
with the accuracy report.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llmc.calibration.accuracy import AccuracyReport, check_windows, score_logit_chunks
from llmc.calibration.data import HELDOUT, load_windows
from llmc.compiler.backends.onnxruntime.accuracy import engine_logit_chunks
from llmc.compiler.config.calibration import CalibrationOptions
from llmc.compiler.frontend.model_source import resolve_model, sha256_files
from llmc.compiler.stages.progress import stage_of
from llmc.compiler.verify.config import VerifyConfig, VerifyError
from llmc.compiler.verify.reference_run import reference_graph, reference_runner, run_reference
from llmc.compiler.verify.segment_compare import SegmentComparison, compare_segment, match_names
from llmc.engine.host import check_host
from llmc.engine.isa import detect_host_isa
from llmc.engine.manifest import read_manifest, verify_files
from llmc.engine.plan import load_plan
from llmc.errors import ModelSourceError
from llmc.heap import release_freed_memory
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.step_inputs import single_prefill


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify_engine`` found; ``passed`` is the verdict on the logits segment."""

    engine_dir: Path
    accuracy: AccuracyReport
    stored_accuracy: AccuracyReport | None  # the build's report, from the manifest
    segments: tuple[SegmentComparison, ...]
    logits_segment: int
    rtol: float
    atol: float
    renamed: dict[str, str] = field(default_factory=dict)  # see ``match_names``
    anchor: dict | None = None  # the build's accuracy anchor (``anchors``), from the manifest

    @property
    def passed(self) -> bool:
        return self.segments[self.logits_segment].passed


def verify_engine(engine_dir: str | Path, config: VerifyConfig, progress=None) -> VerifyResult:
    """Verify the engine at ``engine_dir`` against its unquantized source model (module doc).

    ``progress`` is a ``BuildProgress`` (or None). Raises EngineError subclasses (no engine,
    built for another host, damaged files), VerifyError (bad option, checkpoint digest differs),
    ModelSourceError (checkpoint not found) and CalibrationDataError (bad ``--data``) before the
    model is exported.
    """
    import onnxruntime as ort
    from transformers import AutoTokenizer

    engine_dir = Path(engine_dir)
    stage = stage_of(progress)
    with stage("check engine"):
        manifest = read_manifest(engine_dir)
        check_host(manifest, detect_host_isa(), {"onnxruntime": ort.__version__})
        verify_files(manifest, engine_dir)
        seq_len = config.window_len(manifest.max_seq_len)
        block, provider, plan = manifest.block_size, manifest.provider, load_plan(engine_dir)
        num_blocks = math.ceil(seq_len / block)
        stored = _stored_report(manifest.accuracy_report)
        tokenizer = AutoTokenizer.from_pretrained(str(engine_dir / "tokenizer"))
        data = config.data or (_data_file(stored.data) if stored is not None else None)
        windows = None
        if data is not None:  # a bad file fails here, before the model is loaded
            windows, label = load_windows(HELDOUT, data, None, tokenizer, config.windows, seq_len)
            check_windows(windows)
    with stage("resolve model"):
        src = _checkpoint(manifest, config.model)
    with tempfile.TemporaryDirectory(prefix="llmc-verify-") as work:
        digest, lora = manifest.checkpoint_digest, manifest.lora
        reference = reference_graph(src, digest, block, Path(work), stage, lora)
        if windows is None:
            with stage("sample held-out text"):
                sampler = _sampler(reference, tokenizer, manifest, config.threads)
                windows, label = load_windows(
                    HELDOUT, None, sampler, tokenizer, config.windows, seq_len
                )
                del sampler
                check_windows(windows)
        node_outputs = {o for n in reference.proto.graph.node for o in n.output}
        # Every engine boundary tensor the unquantized graph computes leaves its segment there.
        boundaries = tuple(
            sorted({n for s in plan.segments for n in (*s.inputs, *s.outputs)} & node_outputs)
        )
        with stage("accuracy report") as tick, tempfile.TemporaryFile(dir=work) as spill:
            runner = reference_runner(reference, config.threads, boundaries)
            ref_plan = runner.plan
            shapes, env = run_reference(runner, windows, spill, tick)
            del runner
            release_freed_memory()
            engine = cpu_runner(engine_dir, num_blocks, config.threads, provider)
            chunks = engine_logit_chunks(engine, windows, shapes, spill, block)
            report = score_logit_chunks(chunks, windows, label)
    if engine.single_graph:  # it returns the logits alone: run the segments to capture
        del engine
        engine = cpu_runner(engine_dir, num_blocks, config.threads, provider, False)
    with stage("compare segments (Polygraphy)") as tick:
        # Every boundary tensor of the engine, for the first window.
        engine_env = engine.run_step(single_prefill(windows[0], block))
        del engine
        renamed = match_names(engine_env, env, boundaries)
        del engine_env
        captured = (env, renamed, provider)
        segments = _compare_segments(engine_dir, plan, ref_plan, captured, config, tick)
    logits = next(i for i, s in enumerate(plan.segments) if plan.logits in s.outputs)
    anchor = (manifest.quantization or {}).get("spec", {}).get("anchor")
    return VerifyResult(
        engine_dir, report, stored, tuple(segments), logits, config.rtol, config.atol, renamed,
        anchor,
    )  # fmt: skip


def _compare_segments(engine_dir, plan, ref_plan, captured, config, tick) -> list:
    """``compare_segment`` of each engine segment against the unquantized graph's (its plan
    ``ref_plan``) on the boundary tensors ``captured`` = (reference env, engine names by
    reference name, provider). Raises VerifyError when the two graphs do not have the same
    segments."""
    env, renamed, provider = captured
    if len(ref_plan.segments) != len(plan.segments):
        raise VerifyError(
            f"the engine has {len(plan.segments)} segments, the unquantized graph of its "
            f"checkpoint {len(ref_plan.segments)}: it was not built from this graph"
        )
    segments = []
    for i, (spec, ref_spec) in enumerate(zip(plan.segments, ref_plan.segments, strict=True)):
        segments.append(
            compare_segment(
                i,
                engine_dir,
                spec,
                ref_spec,
                env,
                renamed,
                provider,
                threads=config.threads,
                rtol=config.rtol,
                atol=config.atol,
            )  # fmt: skip
        )
        tick(i + 1, len(plan.segments))
    return segments


def _sampler(reference, tokenizer, manifest, threads: int):
    """What samples held-out text from the unquantized graph (its weights on disk): the build's
    sampler (``EngineTextSampler``), its texts read from and kept in the build's text cache
    (``CachedTextSampler``, by the checkpoint's digest), so a verify of an engine whose build
    sampled its held-out text scores the same text."""
    from llmc.compiler.backends.onnxruntime.text_sampler import (
        CachedTextSampler,
        EngineTextSampler,
    )

    inner = EngineTextSampler(
        reference.proto, reference.weights_dir, tokenizer, manifest.block_size, threads,
        work_dir=reference.weights_dir,
    )  # fmt: skip
    texts = Path(CalibrationOptions().cache_dir).expanduser() / "texts"  # the build's default
    return CachedTextSampler(inner, manifest.checkpoint_digest, texts)


def _checkpoint(manifest, model: str | None):
    """The engine's source checkpoint (``model`` if given), its digest checked."""

    try:
        src = resolve_model(model or manifest.source)
    except ModelSourceError as e:
        if model is not None:
            raise
        raise ModelSourceError(
            f"{e} (the engine's manifest names {manifest.source!r} as its checkpoint; "
            "give the checkpoint's current location with --model)"
        ) from e
    digest = sha256_files(src.weight_files)
    if digest != manifest.checkpoint_digest:
        raise VerifyError(
            f"checkpoint {src.source} has sha256 {digest[:16]}..., but the engine was built "
            f"from {manifest.checkpoint_digest[:16]}...; give the engine's checkpoint with "
            "--model, or rebuild the engine from this one"
        )
    return src


def result_tables(result: VerifyResult) -> list:
    """Rich renderables for the terminal: the accuracy report (with the build's, if any), the
    per-segment comparison, and the verdict."""
    from rich.table import Table
    from rich.text import Text

    parts: list = [Text(result.accuracy.format())]
    if result.stored_accuracy is not None:
        parts.append(Text("as recorded at build time:\n" + result.stored_accuracy.format()))
        if result.anchor is not None:
            from llmc.compiler.quantize.anchors import format_anchor

            parts.append(Text(format_anchor(result.stored_accuracy.to_dict(), result.anchor)))
    else:
        parts.append(Text("no accuracy report in the manifest (an unquantized build)"))
    table = Table(title=f"Polygraphy, per segment (rtol {result.rtol:g}, atol {result.atol:g})")
    for column in ("segment", "outputs", "result", "max abs err", "max rel err"):
        table.add_column(column, justify="right" if "err" in column else "left")
    for s in result.segments:
        name = f"{s.index}" + (" (logits)" if s.index == result.logits_segment else "")
        verdict = "[green]pass[/]" if s.passed else "[red]FAIL[/]"
        if s.note:
            verdict += f" ({s.note})"
        table.add_row(
            name, str(len(s.outputs)), verdict, f"{s.max_abs_error:.3g}", f"{s.max_rel_error:.3g}"
        )
    parts.append(table)
    if result.renamed:
        pairs = ", ".join(f"{e} = {r}" for e, r in sorted(result.renamed.items()))
        parts.append(Text(f"engine tensors matched by value to another name: {pairs}"))
    if result.passed:
        parts.append(Text("PASSED: the logits match the unquantized graph", style="green"))
    else:
        parts.append(
            Text(
                "FAILED: the logits differ from the unquantized graph beyond the tolerances",
                style="red",
            )
        )
    return parts


def _stored_report(d: dict | None) -> AccuracyReport | None:
    """The build's accuracy report from the manifest (None if absent or unreadable)."""
    if d is None:
        return None
    try:
        return AccuracyReport.from_dict(d)
    except ValueError:
        return None


def _data_file(label: str) -> str | None:
    """The data file a stored report's label names, if it still exists. A label may carry a
    note after the path, e.g. ``"held.txt (last 20%)"``."""
    for candidate in (label, label.rsplit(" (", 1)[0]):
        if candidate and Path(candidate).is_file():
            return candidate
    return None
