"""Write a TensorRT engine directory from a checked portable stage, with the target's builder
(``flavour.flavour_for``: TensorRT for RTX on any host, TensorRT 11 on a GPU of the target,
never run: no machine of ours has one it targets).

Layout: ``engine.plan`` (the serialized TensorRT engine), ``manifest.json`` (``EngineManifest``
with ``backend`` "tensorrt" or "tensorrt-rtx" and a ``tensorrt`` record: the builder and its
version, the compute capability, where it was built, builder options, optimization profiles,
lint summary), ``tokenizer/`` and ``generation_config.json`` copied from the stage. Written into
a temporary sibling directory and renamed into place, like the CPU build.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

from llmc.compiler.backends.tensorrt.builder import PLAN_FILE, PlanRequest, optimization_profile
from llmc.compiler.backends.tensorrt.flavour import flavour_for
from llmc.compiler.backends.tensorrt.lint import LintReport
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine import manifest as mf
from llmc.engine.manifest import shared_facts
from llmc.engine.stage import MODEL_FILE, StageManifest
from llmc.engine.staged_dir import staged_dir

_PRECISION = {"float32": "f32", "float16": "fp16", "bfloat16": "bf16"}


def write_engine(
    stage_dir: Path, m: StageManifest, config: BuildConfig, lint_report: LintReport, stage
) -> Path:
    """Build the plan of stage ``m`` (a ``StageManifest``) at ``stage_dir`` with ``config``'s
    limits and TensorRT options, on the target's builder; returns the engine directory. Raises
    what the builder raises (TensorRTBuildError)."""
    out = config.output_dir(m.model_id)
    limits, target = config.export, config.target
    flavour = flavour_for(m.target)
    profile = optimization_profile(
        m.num_kv_heads,
        m.head_dim,
        m.num_layers,
        m.block_size,
        limits.max_num_tokens,
        limits.max_batch,
        limits.max_seq_len,
        lora=bool(m.lora),
    )
    with staged_dir(out) as tmp:
        request = PlanRequest(
            stage_dir / MODEL_FILE,
            tmp / PLAN_FILE,
            profile,
            target.builder_opt_level,
            target.timing_cache,
        )
        with stage(f"{flavour.builder} build ({m.target})") as tick:
            record = flavour.build(request, target, tick)
        record["lint"] = lint_report.to_dict() | {
            "findings": lint_report.to_dict()["findings"][:50]
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
            backend=flavour.backend,
            backend_version=record["version"],
            execution_provider=record["builder"],
            execution_precision=_PRECISION[m.dtype],
            files=mf.file_digests(tmp),
            tensorrt=record,
        )
        mf.write_manifest(manifest, tmp)
    return out
