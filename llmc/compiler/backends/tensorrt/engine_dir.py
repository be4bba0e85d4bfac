"""Write a TensorRT engine directory from a checked portable stage (NEVER RUN: needs a GPU).

Layout: ``engine.plan`` (the serialized TensorRT engine), ``manifest.json`` (``EngineManifest``
with ``backend`` "tensorrt" and a ``tensorrt`` record: TensorRT and CUDA versions, the builder
GPU's compute capability, builder options, optimization profiles, plugin versions, lint
summary), ``tokenizer/`` and ``generation_config.json`` copied from the stage. Written into a
temporary sibling directory and renamed into place, like the CPU build.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from llmc.compiler.backends.tensorrt.builder import PLAN_FILE, build_plan, optimization_profile
from llmc.compiler.backends.tensorrt.lint import LintReport
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine import manifest as mf
from llmc.engine.gpu import arch_capability, detect_gpus
from llmc.engine.manifest import shared_facts
from llmc.engine.stage import MODEL_FILE, StageManifest
from llmc.engine.staged_dir import staged_dir

_PRECISION = {"float32": "f32", "float16": "fp16", "bfloat16": "bf16"}


def write_engine(
    stage_dir: Path, m: StageManifest, config: BuildConfig, lint_report: LintReport, stage
) -> Path:
    """Build the plan of stage ``m`` (a ``StageManifest``) at ``stage_dir`` with ``config``'s
    limits and TensorRT options; returns the engine directory. Raises what ``build_plan``
    raises."""
    import torch  # here: its CUDA version is recorded, and this path runs only on a GPU host

    out = config.output_dir(m.model_id)
    limits, target = config.export, config.target
    profile = optimization_profile(
        m.num_kv_heads,
        m.head_dim,
        m.num_layers,
        m.block_size,
        limits.max_num_tokens,
        limits.max_batch,
        limits.max_seq_len,
    )
    with staged_dir(out) as tmp:
        with stage(f"TensorRT build ({m.target})") as tick:
            record = build_plan(
                stage_dir / MODEL_FILE,
                tmp / PLAN_FILE,
                profile,
                builder_opt_level=target.builder_opt_level,
                hardware_compat=target.hardware_compat,
                timing_cache=target.timing_cache,
                tick=tick,
            )
        gpu = next(g for g in detect_gpus() if g.capability == arch_capability(m.target))
        record |= {
            "cuda_version": torch.version.cuda,
            "compute_capability": f"{gpu.capability[0]}.{gpu.capability[1]}",
            "builder_gpu": gpu.name,
            "lint": lint_report.to_dict() | {"findings": lint_report.to_dict()["findings"][:50]},
        }
        shutil.copytree(stage_dir / "tokenizer", tmp / "tokenizer")
        shutil.copyfile(stage_dir / "generation_config.json", tmp / "generation_config.json")
        facts = shared_facts(m) | {
            "max_seq_len": limits.max_seq_len,
            "max_num_tokens": limits.max_num_tokens,
            "max_batch": limits.max_batch,
            "build_config": config.to_dict(),
            "build_config_hash": config.hash(),
        }
        manifest = mf.EngineManifest(
            **facts,
            isa=[],
            arch=platform.machine(),
            backend="tensorrt",
            backend_version=record["version"],
            execution_provider="TensorRT",
            execution_precision=_PRECISION[m.dtype],
            files=mf.file_digests(tmp),
            tensorrt=record,
        )
        mf.write_manifest(manifest, tmp)
    return out
