"""``share_weights`` and ``compact_files`` on hand-made segments: after the duplicates are
pointed at the earliest file and the files are compacted, every tensor of every segment still
reads its own bytes, and each duplicate is stored once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from llmc.compiler.weights.shared_weights import compact_files, share_weights

RNG = np.random.default_rng(0)
ZEROS = np.zeros(4096, np.int8)  # an int8 zero point: the same in every layer
SHARED = RNG.standard_normal((64, 64)).astype(np.float32)  # in segments 1 and 2


def save_segment(path: Path, tensors: dict[str, np.ndarray]) -> None:
    inits = [numpy_helper.from_array(a, name) for name, a in tensors.items()]
    graph = helper.make_graph([], path.stem, [], [], initializer=inits)
    onnx.save(
        helper.make_model(graph),
        str(path),
        save_as_external_data=True,
        location=path.name + ".data",
        size_threshold=0,
    )


def segments(folder: Path) -> dict[Path, dict[str, np.ndarray]]:
    own = {i: RNG.standard_normal((32, 64)).astype(np.float32) for i in range(3)}
    return {
        folder / "segment_000.onnx": {"zp0": ZEROS, "w0": own[0]},
        # zp1 moves to segment 0; "shared" stays here but must move within this file once zp1's
        # bytes are dropped from it, and segment 2's copy then points at it.
        folder / "segment_001.onnx": {"zp1": ZEROS, "shared": SHARED, "w1": own[1]},
        folder / "segment_002.onnx": {"zp2": ZEROS, "shared2": SHARED, "w2": own[2]},
    }


def test_every_tensor_reads_its_bytes_after_sharing_and_compaction(tmp_path):
    expected = segments(tmp_path)
    for path, tensors in expected.items():
        save_segment(path, tensors)
    before = sum((p.parent / (p.name + ".data")).stat().st_size for p in expected)
    models = {p: onnx.load(str(p), load_external_data=False) for p in expected}

    saved = share_weights(models)
    compact_files(models)

    assert saved == 2 * ZEROS.nbytes + SHARED.nbytes
    for path, tensors in expected.items():
        model = onnx.load(str(path))  # reads every tensor from wherever it now points
        got = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        assert got.keys() == tensors.keys()
        for name, array in tensors.items():
            np.testing.assert_array_equal(got[name], array, err_msg=f"{path.name}: {name}")
    after = sum((p.parent / (p.name + ".data")).stat().st_size for p in expected)
    assert after < before - saved + 3 * 4096  # the duplicates are gone (padding aside)
    locations = {
        t.name: {e.key: e.value for e in t.external_data}["location"]
        for p in expected
        for t in onnx.load(str(p), load_external_data=False).graph.initializer
    }
    assert locations["zp2"] == locations["zp1"] == "segment_000.onnx.data"
    assert locations["shared2"] == "segment_001.onnx.data"


def test_a_file_all_of_whose_bytes_are_still_read_is_left_as_it_is(tmp_path):
    path = tmp_path / "segment_000.onnx"
    save_segment(path, {"a": SHARED, "b": ZEROS})
    data = tmp_path / "segment_000.onnx.data"
    raw, mtime = data.read_bytes(), data.stat().st_mtime_ns
    models = {path: onnx.load(str(path), load_external_data=False)}
    assert share_weights(models) == 0
    compact_files(models)
    assert data.read_bytes() == raw and data.stat().st_mtime_ns == mtime
