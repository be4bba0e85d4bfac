"""What ``build_plan`` asks of TensorRT, against a stand-in ``tensorrt`` module (TensorRT cannot
be installed here, DESIGN §6): plugin I/O aliasing switched on, the AOT implementation
preferred, a refused timing cache and ``--hardware-compat ampere+`` stopping the build; and the
JIT path's buffer description for dtypes ``__cuda_array_interface__`` cannot name."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from llmc.compiler.backends.tensorrt.builder import ShapeRange, TensorRTBuildError, build_plan
from llmc.plugins.paged_attention import trt_register
from llmc.plugins.paged_attention.trt_register import cuda_array_interface


class _Flags:
    STRONGLY_TYPED = 0
    PREFER_AOT_PYTHON_PLUGINS = 5


class _Config:
    def __init__(self, accept_cache: bool):
        self.accept_cache = accept_cache
        self.preview: dict = {}
        self.builder_optimization_level = None
        self.hardware_compatibility_level = None
        self.progress_monitor = None

    def set_preview_feature(self, feature, enabled):
        self.preview[feature] = enabled

    def create_timing_cache(self, blob):
        return blob

    def set_timing_cache(self, cache, ignore_mismatch):
        return self.accept_cache

    def add_optimization_profile(self, profile):
        pass


def _fake_tensorrt(calls: dict, accept_cache: bool = True) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "11.1.0.7"

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            calls["flags"] = flags
            return types.SimpleNamespace(
                num_inputs=1, get_input=lambda i: types.SimpleNamespace(name="input_ids")
            )

        def create_builder_config(self):
            calls["config"] = _Config(accept_cache)
            return calls["config"]

        def create_optimization_profile(self):
            return types.SimpleNamespace(set_shape=lambda *a: None)

        def build_serialized_network(self, network, config):
            return b"plan"

    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
    trt.init_libnvinfer_plugins = lambda logger, namespace: None
    trt.Builder = Builder
    trt.NetworkDefinitionCreationFlag = _Flags
    trt.OnnxParser = lambda network, logger: types.SimpleNamespace(
        parse_from_file=lambda path: True, num_errors=0
    )
    trt.HardwareCompatibilityLevel = types.SimpleNamespace(NONE=0, SAME_COMPUTE_CAPABILITY=2)
    trt.PreviewFeature = types.SimpleNamespace(ALIASED_PLUGIN_IO_10_03="ALIASED_PLUGIN_IO_10_03")
    trt.IProgressMonitor = type("IProgressMonitor", (), {"__init__": lambda self: None})
    return trt


@pytest.fixture
def fake_trt(monkeypatch):
    calls: dict = {}

    def install(accept_cache: bool = True) -> dict:
        monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(calls, accept_cache))
        monkeypatch.setattr(trt_register, "register", lambda: calls.setdefault("registered", 1))
        return calls

    return install


def _build(tmp_path: Path, **options) -> dict:
    profile = {"input_ids": ShapeRange((1,), (4,), (8,))}
    return build_plan(tmp_path / "model.onnx", tmp_path / "engine.plan", profile, **options)


def test_build_enables_plugin_aliasing_and_prefers_aot(fake_trt, tmp_path):
    calls = fake_trt()
    record = _build(tmp_path)
    assert calls["registered"] == 1
    assert calls["config"].preview == {"ALIASED_PLUGIN_IO_10_03": True}
    assert calls["flags"] == (1 << _Flags.STRONGLY_TYPED) | (1 << _Flags.PREFER_AOT_PYTHON_PLUGINS)
    assert (tmp_path / "engine.plan").read_bytes() == b"plan"
    assert record["version"] == "11.1.0.7"
    assert record["preview_features"] == ["ALIASED_PLUGIN_IO_10_03"]


def test_build_refuses_a_timing_cache_tensorrt_rejects(fake_trt, tmp_path):
    fake_trt(accept_cache=False)
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"from another GPU")
    with pytest.raises(TensorRTBuildError, match="refused the timing cache .*timing.cache"):
        _build(tmp_path, timing_cache=str(cache))
    assert not (tmp_path / "engine.plan").exists()


def test_ampere_plus_is_refused_before_tensorrt_is_asked(fake_trt, tmp_path):
    calls = fake_trt()
    with pytest.raises(TensorRTBuildError, match="ampere\\+ cannot hold .* AOT kernel"):
        _build(tmp_path, hardware_compat="ampere+")
    assert "flags" not in calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float16])
def test_cuda_array_interface_describes_buffers_of_any_dtype(dtype):
    """The JIT path describes TensorRT's buffers as same-width integers (tensorrt.plugin's own
    interface raises for BF16/FP8) and views them as the real dtype. Checked on the host with
    numpy's ``__array_interface__``, which reads the same dictionary."""
    full = torch.randn(6, 8).to(dtype)
    view = full[1:5, 2:7]  # strided, offset
    interface = cuda_array_interface(
        view.data_ptr(), view.shape, view.stride(), view.element_size()
    )
    assert interface["typestr"] == {1: "|i1", 2: "<i2"}[view.element_size()]
    assert interface["strides"] == (8 * view.element_size(), view.element_size())
    host = types.SimpleNamespace(__array_interface__=interface | {"stream": None})
    read = torch.from_numpy(np.asarray(host).copy()).view(dtype)
    assert torch.equal(read.view(torch.uint8), view.contiguous().view(torch.uint8))
