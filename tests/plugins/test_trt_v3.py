"""The ``IPluginV3`` PagedAttention plugin's build-time contract with TensorRT for RTX's real
Python bindings (no GPU needed): attributes survive the plugin-field round trip a plan's
serialization makes (strings with their NUL; the fields point into arrays the caller keeps), the
creator declares every attribute, and each position's type follows q's and the cache dtype."""

from __future__ import annotations

import pytest

from llmc.engine.plugin import PluginAttributes
from llmc.engine.tensorrt_rtx import runtime_version

pytestmark = pytest.mark.skipif(runtime_version() is None, reason="TensorRT for RTX absent")


@pytest.fixture(scope="module")
def trt():
    import onnxruntime_ep_nv_tensorrt_rtx  # noqa: F401  (loads the libraries)
    import tensorrt_rtx_bindings

    return tensorrt_rtx_bindings


ATTRIBUTES = PluginAttributes(
    num_heads=4, num_kv_heads=1, head_dim=256, scale=0.0625, sliding_window=512,
    logit_softcap=0.0, block_size=16, layer_idx=7, kv_cache_dtype="fp8", k_scale=0.5,
    v_scale=0.25,
)  # fmt: skip


def test_attributes_survive_the_field_round_trip(trt):
    from llmc.plugins.paged_attention.trt_v3 import attributes_from_fields, plugin_fields

    collection, arrays = plugin_fields(trt, ATTRIBUTES)
    import gc

    gc.collect()  # the fields point into ``arrays``: garbage there would show here
    assert attributes_from_fields(collection) == ATTRIBUTES
    del arrays


def test_the_creator_declares_every_attribute(trt):
    from dataclasses import fields

    from llmc.plugins.paged_attention.trt_v3 import plugin_classes

    _, creator_class = plugin_classes(trt)
    creator = creator_class()
    declared = [f.name for f in creator.field_names]
    assert declared == [f.name for f in fields(PluginAttributes)]
    assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (
        "PagedAttention",
        "llmc",
        "1",
    )


@pytest.mark.parametrize(
    ("kv_cache_dtype", "cache_type"), [("auto", "BF16"), ("fp8", "FP8"), ("int8", "INT8")]
)
def test_each_position_has_one_type(trt, kv_cache_dtype, cache_type):
    from dataclasses import replace

    from llmc.plugins.paged_attention.trt_v3 import expected_type

    a = replace(ATTRIBUTES, kv_cache_dtype=kv_cache_dtype)
    dt = trt.DataType
    want = [dt.BF16] * 3 + [getattr(dt, cache_type)] * 2 + [dt.INT32] * 3 + [dt.INT64]
    want += [dt.BF16] + [getattr(dt, cache_type)] * 2  # outputs: attention, the two caches
    assert [expected_type(trt, pos, dt.BF16, a) for pos in range(12)] == want
