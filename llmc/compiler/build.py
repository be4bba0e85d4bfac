"""``build``: checkpoint -> ONNX with plugins -> passes -> engine directory (DESIGN §1).

Each stage is a function of the previous stage's artifact; the engine is written to a temporary
directory beside the target and renamed into place at the end, so a failed or interrupted build
never leaves a half-written engine where the runtime would find it.
"""

from __future__ import annotations

from pathlib import Path

from llmc.compiler.build_config import CPU_TARGET, BuildConfig
from llmc.compiler.build_steps import (
    BuildResult,
    float_graph,
    no_stage,
    publish,
    save_tokenizer_and_generation_config,
)
from llmc.compiler.lower_cpu import lower_to_cpu
from llmc.compiler.model_source import load_model, load_tokenizer, resolve_model, sha256_files
from llmc.compiler.provider_choice import ProviderSelection, check_requested, select_provider
from llmc.compiler.provider_timing import probe_steps
from llmc.compiler.quantize import pipeline as qp
from llmc.compiler.quantize.formats import FORMATS
from llmc.compiler.staged_dir import staged_dir
from llmc.compiler.tensorrt.gpu_build import build_gpu
from llmc.engine import manifest as mf
from llmc.engine.isa import detect_host_isa
from llmc.engine.kv_cache import cache_spec
from llmc.engine.plugin import PLUGIN_ID, PLUGIN_VERSION
from llmc.engine.provider import ProviderChoice, provider_for_dtype, provider_version
from llmc.errors import BuildConfigError


def build(config: BuildConfig, progress=None) -> BuildResult:
    """Build one engine as ``config`` says.

    ``progress`` is a ``BuildProgress`` (or None): it is told each stage's start and end.
    Raises BuildConfigError for a target this host cannot build, ModelSourceError for a bad
    model path, and whatever export/ORT raise for a model they cannot handle.
    """
    config.validate()
    if config.arch != CPU_TARGET:
        return build_gpu(config, progress)  # TensorRT: portable stage, then the plan
    check_requested(config.dtype, config.execution_provider)  # before any work: a clear error
    stage = progress.stage if progress is not None else no_stage
    with stage("resolve model"):
        src = resolve_model(config.model)
        tokenizer = load_tokenizer(src)
        checkpoint_digest = sha256_files(src.weight_files)
    # The graph's form (optimized for the CPU EP, or portable) and precision follow the dtype;
    # which provider runs it is measured once it is built (``provider_choice``).
    choice = provider_for_dtype(config.dtype)
    quantized = FORMATS[config.quant].quantizes
    if quantized:
        calib_source, heldout_source = qp.text_sources(config)  # bad files fail before work
    host = detect_host_isa()
    required_isa = engine_isa(host.features, choice, config.quant)
    missing = [f for f in required_isa if f not in host.features]
    if missing:
        raise BuildConfigError(
            f"--dtype {config.dtype} on cpu needs {', '.join(missing)}, which this host "
            f"({host.name}) does not run; build with --dtype float32"
        )
    with stage("load weights"):
        # CPU engines keep float32 weights; bfloat16 is the provider's compute precision.
        model = load_model(src, "float32")
    spec = cache_spec(model)
    proto, pass_report = float_graph(model, config.block_size, stage)
    reference = quant_report = None
    if quantized:
        reference = proto
        proto, quant_report = qp.quantize(
            config,
            reference,
            model,
            tokenizer,
            checkpoint_digest,
            calib_source,
            stage,
            bound_pairs=int8_bound_pairs(host.features),
        )
        qp.rewrite_for_cpu(proto, quant_report.counts)  # e.g. FP8 weights as float32

    out = config.output_dir(src.model_id)
    with staged_dir(out) as tmp:
        with stage("lower to ONNX Runtime (cpu)") as tick:
            _, optimized_ops = lower_to_cpu(
                proto,
                tmp,
                threads=config.threads,
                progress=tick,
                choice=choice,
                session_config=qp.session_config(config.quant),
            )
        quantization = accuracy = None
        if quant_report is not None:
            quantization = quant_report.to_dict()
            quantization["fast_path"] = qp.check_fast_path(
                config.quant, quant_report.counts, optimized_ops
            )
            with stage("accuracy report") as tick:
                accuracy = qp.accuracy_report(
                    config, reference, tmp, model, tokenizer, heldout_source, tick
                )
        with stage("choose execution provider"):
            selection = choose_provider(config, tmp, int(model.config.vocab_size))
        choice = ProviderChoice(selection.provider, selection.precision)
        with stage("tokenizer and manifest"):
            save_tokenizer_and_generation_config(src, model, tokenizer, tmp)
            tok_digest = sha256_files(sorted((tmp / "tokenizer").iterdir()))
            import onnxruntime as ort

            manifest = mf.EngineManifest(
                model_id=src.model_id,
                source=src.source,
                checkpoint_digest=checkpoint_digest,
                tokenizer_digest=tok_digest,
                target=config.arch,
                isa=required_isa,
                arch=host.arch,
                dtype=config.dtype,
                quant=config.quant,
                kv_cache_dtype="float32"
                if config.kv_cache_dtype == "auto"
                else config.kv_cache_dtype,
                max_seq_len=config.max_seq_len,
                max_num_tokens=config.max_num_tokens,
                max_batch=config.max_batch,
                block_size=config.block_size,
                num_layers=spec.num_layers,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                vocab_size=int(model.config.vocab_size),
                plugin_versions={PLUGIN_ID: PLUGIN_VERSION},
                backend="onnxruntime",
                backend_version=ort.__version__,
                execution_provider=choice.name,
                execution_precision=choice.precision,
                execution_provider_version=provider_version(choice),
                provider_selection=selection.to_dict(),
                build_config=config.to_dict(),
                build_config_hash=config.hash(),
                pass_report=pass_report,
                accuracy_report=accuracy.to_dict() if accuracy is not None else None,
                quantization=quantization,
                files=mf.file_digests(tmp),
            )
            mf.write_manifest(manifest, tmp)
    entry = publish(config, out, stage)
    return BuildResult(out, pass_report, optimized_ops, quantization, accuracy, entry)


def choose_provider(config: BuildConfig, engine_dir: Path, vocab_size: int) -> ProviderSelection:
    """Measure the execution-provider candidates on the engine just lowered into
    ``engine_dir`` and choose one (``provider_choice.select_provider``)."""
    probe = probe_steps(
        config.block_size, vocab_size, config.max_seq_len, config.max_num_tokens, config.max_batch
    )
    return select_provider(
        engine_dir, config.dtype, config.execution_provider, probe, config.threads
    )


def int8_bound_pairs(host_features: tuple[str, ...]) -> bool:
    """Whether int8 W8A8 weights need adjacent pairs bounded on this host: ORT's int8 GEMM
    without AVX-512 VNNI saturates on plain 8-bit weights (``llmc.quant.grids``)."""
    return "avx512-vnni" not in host_features


def engine_isa(
    host_features: tuple[str, ...], choice: ProviderChoice, quant: str = "none"
) -> list[str]:
    """The ISA features a CPU engine depends on: the SIMD width ORT laid its graph out for,
    AVX-512 BF16 for bf16 compute, and what the ``quant`` format needs (``cpu_isa``: AVX-512
    VNNI for int8 W8A8 with full 8-bit weights).

    ORT's optimizer picks blocked layouts by vector width (AVX-512 vs AVX2); its kernels dispatch
    at run time. Without VNNI, ORT's int8 GEMM saturates on plain 8-bit weights, so an int8
    engine built on a VNNI host requires VNNI, and one built elsewhere bounds its weight pairs
    so that it runs exactly anywhere (``llmc.quant.grids``).
    """
    width = next((w for w in ("avx512", "avx2", "neon") if w in host_features), None)
    required = [width] if width else []
    if choice.precision == "bf16":
        required.append("avx512-bf16")
    required += FORMATS[quant].cpu_isa(host_features)
    return required
