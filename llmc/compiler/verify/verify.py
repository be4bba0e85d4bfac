"""``llmc verify``: check a built engine against the unquantized model it was built from.

The reference is rebuilt from the engine manifest's source checkpoint (its digest must match the
manifest) as the unquantized engine graph (``stages.export.float_graph``). Two checks run on it:

1. The accuracy report (``llmc.calibration.accuracy``) on held-out text: ``--data`` (its held-out
   part), else the file the build's report names if it still exists, else text sampled from the
   model with the held-out seed.
2. Per segment, Polygraphy's comparator (``OnnxrtRunner`` + ``Comparator.compare_accuracy``, as
   TensorRT users run it): the reference runs one window and every tensor crossing a segment
   boundary is captured; then each engine segment and the matching unquantized segment run on
   the same captured inputs, so an error shows up in the segment that makes it instead of
   piling up through the layers. Engine segments and the unquantized graph's segments share
   their boundary tensor names because both are cut by ``split_at_plugins`` from the same
   export, except where the exporter names tensors differently from run to run
   (``match_names`` re-matches those by value and the result lists them).

The verdict is Polygraphy's on the logits segment at the given tolerances. Its elementwise check
fails an element only when it exceeds both ``atol`` and ``rtol`` (relative to the reference). The
defaults (1e-3) leave a float32 engine a wide margin (measured on Gemma 3 270M: every segment's
outputs equal the unquantized graph's exactly); quantized and bfloat16 engines differ by design
and need looser tolerances, chosen from the max errors this check reports and judged together
with the accuracy report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from llmc.calibration.accuracy import AccuracyReport, evaluate_accuracy
from llmc.calibration.data import HELDOUT, load_windows
from llmc.compiler.frontend.model_source import load_model, resolve_model, sha256_files
from llmc.compiler.stages.export import float_graph
from llmc.compiler.stages.progress import stage_of
from llmc.compiler.verify.config import VerifyConfig, VerifyError
from llmc.compiler.verify.segment_compare import SegmentComparison, compare_segment, match_names
from llmc.engine.host import check_host
from llmc.engine.isa import detect_host_isa
from llmc.engine.manifest import read_manifest, verify_files
from llmc.engine.plan import load_plan
from llmc.engine.split import split_at_plugins
from llmc.errors import ModelSourceError
from llmc.runtime.runners.cpu_runner import cpu_runner
from llmc.runtime.runners.ort_runner import OrtRunner
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
    model is loaded.
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
        stored = _stored_report(manifest.accuracy_report)
        tokenizer = AutoTokenizer.from_pretrained(str(engine_dir / "tokenizer"))
        data = config.data or (_data_file(stored.data) if stored is not None else None)
        windows = None
        if data is not None:  # a bad file fails here, before the model is loaded
            windows, label = load_windows(HELDOUT, data, None, tokenizer, config.windows, seq_len)
    with stage("resolve model"):
        src = _checkpoint(manifest, config.model)
    with stage("load weights"):
        model = load_model(src, "float32")
    proto, _ = float_graph(model, manifest.block_size, stage)
    if windows is None:
        with stage("sample held-out text"):
            windows, label = load_windows(HELDOUT, None, model, tokenizer, config.windows, seq_len)
    del model
    plan = load_plan(engine_dir)
    node_outputs = {o for n in proto.graph.node for o in n.output}
    # Every engine boundary tensor the unquantized graph computes leaves its segment there too.
    boundaries = tuple(
        sorted({n for s in plan.segments for n in (*s.inputs, *s.outputs)} & node_outputs)
    )
    num_blocks = math.ceil(seq_len / manifest.block_size)
    with stage("accuracy report") as tick:
        reference = OrtRunner.from_model(proto, num_blocks, config.threads, boundaries)
        provider = manifest.provider
        engine = cpu_runner(engine_dir, num_blocks, config.threads, provider)
        report = evaluate_accuracy(reference, engine, windows, manifest.block_size, label, tick)
        if engine.single_graph:  # it returns the logits alone: run the segments to capture
            del engine
            engine = cpu_runner(engine_dir, num_blocks, config.threads, provider, False)
        # Every boundary tensor of both, for one window.
        step = single_prefill(windows[0], manifest.block_size)
        env, engine_env = reference.run_step(step), engine.run_step(step)
        del engine, reference
        renamed = match_names(engine_env, env, boundaries)
        del engine_env
    with stage("compare segments (Polygraphy)") as tick:
        # Split again rather than keep the runner's segments: one copy of the weights at a time.
        ref_segments, ref_plan = split_at_plugins(proto, extra_outputs=boundaries)
        del proto
        captured = (env, renamed, provider)
        segments = _compare_segments(
            engine_dir, plan, ref_segments, ref_plan, captured, config, tick
        )
    logits = next(i for i, s in enumerate(plan.segments) if plan.logits in s.outputs)
    anchor = (manifest.quantization or {}).get("spec", {}).get("anchor")
    return VerifyResult(
        engine_dir, report, stored, tuple(segments), logits, config.rtol, config.atol, renamed,
        anchor,
    )  # fmt: skip


def _compare_segments(engine_dir, plan, ref_segments, ref_plan, captured, config, tick) -> list:
    """``compare_segment`` of each engine segment against the unquantized graph's
    (``ref_segments``, freed as they are compared) on the boundary tensors ``captured`` =
    (reference env, engine names by reference name, provider). Raises VerifyError when the two
    graphs do not have the same segments."""
    env, renamed, provider = captured
    if len(ref_plan.segments) != len(plan.segments):
        raise VerifyError(
            f"the engine has {len(plan.segments)} segments, the unquantized graph of its "
            f"checkpoint {len(ref_plan.segments)}: it was not built from this graph"
        )
    segments = []
    for i, (spec, ref_spec) in enumerate(zip(plan.segments, ref_plan.segments, strict=True)):
        ref_model, ref_segments[i] = ref_segments[i], None  # free each segment once compared
        segments.append(
            compare_segment(
                i,
                engine_dir,
                spec,
                ref_model,
                ref_spec,
                env,
                renamed,
                provider,
                threads=config.threads,
                rtol=config.rtol,
                atol=config.atol,
            )  # fmt: skip
        )
        del ref_model
        tick(i + 1, len(plan.segments))
    return segments


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
