"""engine.onnx: an engine's segments joined with their plugin nodes (single_graph.py), run by
OrtRunner as one ORT session with the PagedAttention custom op, against the segments form."""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import sys

import numpy as np
import onnx
import pytest

from llmc.compiler.backends.onnxruntime.single_graph import GRAPH_FILE, write_single_graph
from llmc.engine.plan import ExecutionPlan, save_plan
from llmc.engine.plugin import node_fpmath_mode, plugin_nodes
from llmc.runtime.runners.ort_runner import OrtRunner
from tests.runtime.test_kv_cache_quant import as_bytes, step_inputs, write_engine

STEPS = (step_inputs(7, 7, [4, 1]), step_inputs(8, 1, [4, 1]), step_inputs(9, 1, [4, 1, 5]))


def with_graph(engine_dir, plan: ExecutionPlan) -> ExecutionPlan:
    plan = dataclasses.replace(plan, graph=write_single_graph(engine_dir, plan))
    save_plan(plan, engine_dir)
    return plan


def assert_same_runs(graph: OrtRunner, segments: OrtRunner) -> None:
    assert graph.single_graph and not segments.single_graph
    for step in STEPS:
        np.testing.assert_array_equal(graph.execute(step), segments.execute(step))
        for name, cache in graph.kv_caches.items():
            np.testing.assert_array_equal(as_bytes(cache), as_bytes(segments.kv_caches[name]))
    assert all(as_bytes(c).any() for c in graph.kv_caches.values())


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_graph_equals_segments_bit_for_bit(tmp_path, kv_cache_dtype: str) -> None:
    with_graph(tmp_path, write_engine(tmp_path, kv_cache_dtype))

    graph = OrtRunner(tmp_path, num_blocks=6)  # the default takes the graph
    addresses = {name: c.ctypes.data for name, c in graph.kv_caches.items()}
    assert_same_runs(graph, OrtRunner(tmp_path, num_blocks=6, single_graph=False))
    assert {name: c.ctypes.data for name, c in graph.kv_caches.items()} == addresses


@pytest.mark.parametrize("fpmath_mode", ["strict", "bf16"])
def test_the_joined_graph_passes_the_checker_and_holds_no_weights(tmp_path, fpmath_mode) -> None:
    from llmc.plugins import schema

    schema.register_schema()
    plan = write_engine(tmp_path, "auto")
    calls = [dataclasses.replace(p, fpmath_mode=fpmath_mode) for p in plan.plugins]
    plan = with_graph(tmp_path, dataclasses.replace(plan, plugins=calls))
    model = onnx.load(str(tmp_path / GRAPH_FILE), load_external_data=False)

    onnx.checker.check_model(model)
    assert {node_fpmath_mode(n) for n in plugin_nodes(model)} == {fpmath_mode}
    assert [n.op_type for n in model.graph.node].count("PagedAttention") == len(plan.plugins)
    assert [o.name for o in model.graph.output] == ["logits"]
    # write_engine saves weights inline; the joined graph copies them, it does not re-save them
    # (a real engine's segments hold external data, which the graph only points to).
    assert (tmp_path / GRAPH_FILE).stat().st_size < 2 * sum(
        (tmp_path / s.file).stat().st_size for s in plan.segments
    )


def test_initializers_of_one_name_and_other_bytes_are_kept_apart(tmp_path) -> None:
    """Segment 2's weight renamed to segment 1's first weight's name: the join must rename it
    back apart, or the logits would come from the wrong matrix."""
    plan = write_engine(tmp_path, "auto")
    first, last = (onnx.load(str(tmp_path / s.file)) for s in (plan.segments[1], plan.segments[2]))
    clash = first.graph.initializer[0].name
    last.graph.node[0].input[1] = last.graph.initializer[0].name = clash
    onnx.save(last, str(tmp_path / plan.segments[2].file))
    with_graph(tmp_path, plan)

    assert_same_runs(
        OrtRunner(tmp_path, num_blocks=6), OrtRunner(tmp_path, num_blocks=6, single_graph=False)
    )


def test_an_engine_without_the_graph_runs_in_segments(tmp_path) -> None:
    write_engine(tmp_path, "auto")  # plan.graph == ""

    assert not OrtRunner(tmp_path, num_blocks=6).single_graph
    with pytest.raises(RuntimeError, match="no engine.onnx"):
        OrtRunner(tmp_path, num_blocks=6, single_graph=True)


def test_bad_metadata_is_a_value_error_and_writes_nothing(tmp_path) -> None:
    with_graph(tmp_path, write_engine(tmp_path, "int8"))
    runner = OrtRunner(tmp_path, num_blocks=6)
    step = step_inputs(7, 7, [4, 1])
    bad = dataclasses.replace(step, slot_mapping=step.slot_mapping + 1000)

    with pytest.raises(ValueError, match="bad attention metadata: slot_mapping holds a slot"):
        runner.execute(bad)
    assert not any(as_bytes(c).any() for c in runner.kv_caches.values())


def resident_share(array: np.ndarray) -> float:
    """The share of ``array``'s memory pages resident in RAM (Linux ``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = array.ctypes.data // page * page
    pages = (array.ctypes.data + array.nbytes - start + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) / pages


def test_resident_share_tells_a_fresh_mapping_from_a_written_one() -> None:
    # A mapping of its own: np.empty may reuse heap pages an earlier test wrote (malloc's mmap
    # threshold grows to 32 MB after large frees), which are resident.
    mapping = mmap.mmap(-1, 8 * 2**20)
    fresh = np.frombuffer(mapping, np.uint8)
    assert resident_share(fresh) == 0.0
    fresh[:] = 1
    assert resident_share(fresh) == 1.0
    del fresh


@pytest.mark.skipif(sys.platform != "linux", reason="reads residency with Linux's mincore")
def test_the_kv_cache_is_resident_from_load(tmp_path) -> None:
    """Every page of the cache is mapped when the runner is made, not at a step's first write
    into it (which cost a fresh server ~5% of each prefill). Read per page of the caches: the
    process's RSS would also count (or miss) memory an earlier test freed."""
    write_engine(tmp_path, "auto")

    runner = OrtRunner(tmp_path, num_blocks=16384, single_graph=False)

    assert sum(c.nbytes for c in runner.kv_caches.values()) >= 32 * 2**20
    assert all(resident_share(c) == 1.0 for c in runner.kv_caches.values())
