"""A tied vocabulary projection split into row blocks (``split_projection.py``): ranges of the
table's own bytes, one Gemm each, joined by a Concat; the logits are those of the whole Gemm."""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx.external_data_helper import ExternalDataInfo

from llmc.compiler.backends.onnxruntime import lower as lower_cpu
from llmc.compiler.backends.onnxruntime.rewrites.split_projection import split_projections
from llmc.compiler.build import build
from llmc.compiler.config.build_config import BuildConfig
from llmc.runtime.runners.ort_runner import OrtRunner
from llmc.runtime.runners.step_inputs import single_prefill
from tests.tiny_models import make_tiny_gemma3


def _logits(engine_dir, single_graph: bool) -> np.ndarray:
    ids = np.array([5, 17, 3, 99, 42, 7, 256, 1, 300, 12, 64], np.int64)
    runner = OrtRunner(engine_dir, 4, single_graph=single_graph)
    return runner.execute(single_prefill(ids, 4))


def test_split_projection_reads_ranges_of_the_table_and_gives_the_same_logits(
    tmp_path, monkeypatch
):
    ckpt = make_tiny_gemma3(tmp_path / "ckpt", sharp=True)  # tied [512, 64] float32 table
    whole = build(BuildConfig.of(model=str(ckpt), block_size=4, output=str(tmp_path / "w")))
    split = functools.partial(split_projections, max_block_bytes=40 << 10)
    monkeypatch.setattr(lower_cpu, "split_projections", split)
    blocks = build(BuildConfig.of(model=str(ckpt), block_size=4, output=str(tmp_path / "b")))

    last = sorted((blocks.engine_dir / "segments").glob("segment_*.onnx"))[-1]
    model = onnx.load(str(last), load_external_data=False)
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 4  # 160 + 160 + 160 + 32 rows (160 rows of 256 bytes: 40 KiB)
    concat = next(n for n in model.graph.node if n.op_type == "Concat" and "__rows" in n.name)
    assert list(concat.input) == [g.output[0] for g in gemms]
    inits = {t.name: t for t in model.graph.initializer}
    infos = [ExternalDataInfo(inits[g.input[1]]) for g in gemms]
    assert len({i.location for i in infos}) == 1
    assert [i.offset for i in infos] == [infos[0].offset + k * 160 * 256 for k in range(4)]
    assert all(i.offset % 4096 == 0 for i in infos)
    assert sum(i.length for i in infos) == 512 * 64 * 4
    sizes = [p.stat().st_size for p in (blocks.engine_dir / "segments").glob("*.data")]
    assert sum(sizes) == sum(
        p.stat().st_size for p in (whole.engine_dir / "segments").glob("*.data")
    )

    for single_graph in (True, False):
        np.testing.assert_array_equal(
            _logits(blocks.engine_dir, single_graph), _logits(whole.engine_dir, single_graph)
        )
