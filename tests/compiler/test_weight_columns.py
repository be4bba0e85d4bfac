"""A weight read a slice of output channels at a time from its bfloat16 stored bytes
(llmc.compiler.quantize.weight_columns), and the 8-bit weight-only format reading it so: the same
values and codes as the whole float32 weight gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import pytest

from llmc.compiler.quantize.formats import int8_weight_only
from llmc.compiler.quantize.matmul_targets import QuantTarget
from llmc.compiler.quantize.weight_columns import WeightColumns
from llmc.compiler.weights.stored_weights import (
    WidenedTensor,
)
from llmc.quant.protocol import QuantSpec
from tests.compiler.test_stored_weights import _bf16_exact, saved_and_folded


def _stored(tmp_path, w: np.ndarray) -> tuple[ir.TensorProtocol, ir.TensorProtocol]:
    """``w``'s bfloat16 stored tensor and the float32 tensor folding gives."""
    source, wide = saved_and_folded(tmp_path, w)
    return source, wide.const_value


@pytest.mark.parametrize("transposed", [False, True])
def test_slices_are_the_widened_weights_slices(tmp_path, transposed):
    w = _bf16_exact((64, 48), 0)
    source, _ = _stored(tmp_path, w)
    columns = WeightColumns(source, transposed)
    full = w.T if transposed else w
    assert columns.shape == full.shape and columns.dtype == np.float32
    for key in (np.s_[:, 5:20], np.s_[:, 40:], np.s_[3:9, 1:2]):
        part = columns[key]
        assert part.dtype == np.float32
        np.testing.assert_array_equal(part, full[key])
    np.testing.assert_array_equal(np.asarray(columns), full)
    assert np.asarray(columns, np.float64).dtype == np.float64


def test_a_format_reading_column_slices_gets_them_from_the_stored_bytes(tmp_path):
    w = _bf16_exact((64, 48), 0)
    source, wide = _stored(tmp_path, w)
    assert isinstance(wide, WidenedTensor) and wide.stored is source
    target = QuantTarget(None, "lm_head", "x", wide, True, True)
    fmt = int8_weight_only.FORMAT
    assert isinstance(target.weight_for(fmt), WeightColumns)
    assert isinstance(target.weight_for(object()), np.ndarray)  # others get the float32 array
    np.testing.assert_array_equal(np.asarray(target.weight_for(fmt)), w.T)


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_weight_only8_quantizes_slices_as_the_whole_weight(tmp_path, monkeypatch, rounding):
    # Column slices of 16 (a last one of 16 too, and of 8 with 40 columns) read from the stored
    # bytes give the codes and scales of the float32 weight quantized in one slice.
    w = _bf16_exact((64, 48), 0)
    source, _ = _stored(tmp_path, w)
    spec = QuantSpec(quant="int4", int4_block_size=32, weight_rounding=rounding)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 64)).astype(np.float32) @ rng.standard_normal((64, 64))
    stats = SimpleNamespace(sample=x[:16], channel_absmax=np.abs(x).max(0), gram=x.T @ x)
    fmt = int8_weight_only.FORMAT
    whole = fmt.quantize(w, stats, spec)
    monkeypatch.setattr(int8_weight_only, "COLUMNS", 16)
    sliced = fmt.quantize(WeightColumns(source, False), stats, spec)
    np.testing.assert_array_equal(sliced.weight.data, whole.weight.data)
    np.testing.assert_array_equal(sliced.weight.scale, whole.weight.scale)
    assert sliced.record == whole.record == {"rounding": rounding, "format": fmt.label}
    monkeypatch.setattr(int8_weight_only, "COLUMNS", 40)
    np.testing.assert_array_equal(fmt.quantize(w, stats, spec).weight.data, whole.weight.data)
