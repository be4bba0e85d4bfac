"""Write quantization into an engine graph as explicit, symmetric Q/DQ nodes (DESIGN §5).

Per target MatMul ``Y = X W`` (see ``targets.py``):
- ``int8`` (W8A8, SmoothQuant): ``X -> Q/DQ(int8, per-tensor) -> MatMul <- DQ(int8 W, per-channel)``
- ``fp8``: the same with FP8 E4M3FN for activations and weights.
- ``int4`` (weight-only): ``X -> MatMul <- DQ(int4 W, block-wise along K)`` with AWQ (or RTN)
  scales.
- ``int8_weight_only`` modules (``QuantSpec.weight_only8``, default per format in
  ``build_config.DEFAULT_WEIGHT_ONLY8``): ``X -> MatMul <- DQ(int8 W, block-wise along K)``; for
  the layers whose activations or weights lose too much in the build's format (llama.cpp's Q4_K_M
  likewise keeps its output tensor at ~6 bits).
With ``weight_rounding`` "gptq" every weight keeps the grid (scales) chosen above and its codes
are re-chosen by GPTQ with the Gram matrix of its calibration inputs (``rounding.py``).
Zero points are 0 everywhere. A smoothing factor s (SmoothQuant or AWQ) multiplies W's rows;
X is divided by s in the preceding RMSNormalization's scale when X is that norm's only use, else
by an inserted Mul. With ``kv_cache_dtype`` fp8/int8, every PagedAttention node gets per-layer
``k_scale``/``v_scale`` from calibration (amax / 448 or / 127).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx_ir as ir

from llmc.calibration.awq import awq_clip, awq_search
from llmc.calibration.observers import TensorStats, observe_amax
from llmc.calibration.smoothquant import search_alpha, smoothquant_scales, w8a8_output_error
from llmc.compiler.quantize import formats
from llmc.compiler.quantize.rounding import gptq_on_grid, smoothed_hessian
from llmc.compiler.quantize.targets import QuantTarget, find_targets, is_excluded
from llmc.plugins import schema


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize (the quantization options of ``BuildConfig``)."""

    quant: str  # "int8" | "fp8" | "int4"
    calib_method: str = "max"
    smoothquant_alpha: float = 0.5
    smoothquant_alphas: tuple[float, ...] = ()  # per-layer choice among these (search_alpha)
    int4_block_size: int = 128
    int4_method: str = "awq"  # "awq" | "rtn"
    weight_only8: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    kv_cache_dtype: str = "auto"
    weight_rounding: str = "nearest"  # "nearest" | "gptq"
    bound_pairs: bool = False  # int8 weight pairs within 128, for GEMMs without VNNI (formats)


@dataclass
class QuantReport:
    """What ``quantize_graph`` did: per-module format and numbers, excluded modules, counts."""

    spec: dict
    modules: dict[str, dict] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    kv_cache: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "spec": self.spec,
            "counts": self.counts,
            "excluded": self.excluded,
            "modules": self.modules,
            "kv_cache": self.kv_cache,
        }


def kv_key(layer_idx: int, which: str) -> str:
    """Statistics key of a layer's key or value input to PagedAttention (``which``: k | v)."""
    return f"kv_cache.{layer_idx}.{which}"


def calibration_tensors(model: ir.Model, spec: QuantSpec) -> dict[str, str]:
    """The statistics ``quantize_graph`` needs for ``spec``: {key: tensor name}. Keys are stable
    across exports (checkpoint module names, ``kv_cache.<layer>.k|v``); tensor names are not
    (the exporter numbers them in trace order, which for Gemma 3 depends on the hash seed)."""
    skip = spec.exclude if spec.weight_rounding == "gptq" else spec.exclude + spec.weight_only8
    names = {t.module: t.activation for t in find_targets(model) if not is_excluded(t.module, skip)}
    if spec.kv_cache_dtype in ("fp8", "int8"):
        for node in _plugins(model.graph):
            layer = int(node.attributes["layer_idx"].as_int())
            names[kv_key(layer, "k")] = node.inputs[1].name
            names[kv_key(layer, "v")] = node.inputs[2].name
    return names


def gptq_keys(model: ir.Model, spec: QuantSpec) -> frozenset[str]:
    """The keys of ``calibration_tensors`` whose Gram matrix GPTQ needs (none unless
    ``spec.weight_rounding`` is "gptq")."""
    if spec.weight_rounding != "gptq":
        return frozenset()
    return frozenset(
        t.module for t in find_targets(model) if not is_excluded(t.module, spec.exclude)
    )


def _plugins(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph if n.domain == schema.DOMAIN and n.op_type == schema.OP_TYPE]


def quantize_graph(model: ir.Model, stats: dict[str, TensorStats], spec: QuantSpec) -> QuantReport:
    """Rewrite ``model`` in place; ``stats`` are the calibration statistics of
    ``calibration_tensors(model, spec)``, by key. Raises ValueError on an unknown format or a tensor
    without statistics."""
    if spec.quant not in ("int8", "fp8", "int4"):
        raise ValueError(f"cannot quantize to {spec.quant!r}")
    report = QuantReport(spec=spec.__dict__ | {"exclude": list(spec.exclude)})
    counts: Counter = Counter()
    names = _Names(model.graph)
    for target in find_targets(model):
        if is_excluded(target.module, spec.exclude):
            report.excluded.append(target.module)
            continue
        weight_only = is_excluded(target.module, spec.weight_only8)
        if not weight_only and target.module not in stats:
            raise ValueError(f"no calibration statistics for {target.module!r}")
        entry = _quantize_target(model.graph, target, stats.get(target.module), spec, names)
        report.modules[target.module] = entry
        counts[entry["format"]] += 1
    if spec.kv_cache_dtype in ("fp8", "int8"):
        report.kv_cache = _set_kv_scales(model.graph, stats, spec)
    _drop_dead(model.graph)
    report.counts = dict(sorted(counts.items()))
    return report


def _quantize_target(
    graph: ir.Graph, t: QuantTarget, stats: TensorStats | None, spec: QuantSpec, names: _Names
) -> dict:
    w = t.weight
    prefix = t.module
    entry: dict = {"shape": list(w.shape)}
    if is_excluded(t.module, spec.weight_only8):
        qw = formats.quantize_weight_blockwise(w, 8, spec.int4_block_size)
        qw = _rounded(qw, w, stats, None, spec, entry)
        entry["format"] = "int8_weight_only"
        _replace_weight(graph, t, t.node.inputs[0], qw, names)
        return entry
    if spec.quant == "int4":
        s = clip = None
        if spec.int4_method == "awq" and w.shape[0] % spec.int4_block_size == 0:
            res = awq_search(stats.sample, stats.channel_meanabs, w, spec.int4_block_size)
            s = res.scales if res.alpha > 0 else None
            sample = stats.sample if s is None else stats.sample / s[None, :]
            clip = awq_clip(sample, _scaled(w, s), spec.int4_block_size)
            entry.update(awq_alpha=res.alpha, mse=res.error, mse_rtn=res.error_rtn)
        x = _smooth_input(graph, t, s, names)
        qw = formats.quantize_weight_blockwise(_scaled(w, s), 4, spec.int4_block_size, clip)
        qw = _rounded(qw, _scaled(w, s), stats, s, spec, entry)
        entry["format"] = "int4_weight_only"
        _replace_weight(graph, t, x, qw, names)
        return entry
    fmt = spec.quant
    s = None
    if fmt == "int8" and spec.smoothquant_alphas:
        error = w8a8_output_error(stats, w, spec.calib_method, spec.bound_pairs)
        alpha, s = search_alpha(stats.channel_absmax, w, spec.smoothquant_alphas, error)
        entry["smoothquant_alpha"] = alpha
    elif fmt == "int8":
        s = smoothquant_scales(stats.channel_absmax, w, spec.smoothquant_alpha)
        entry["smoothquant_alpha"] = spec.smoothquant_alpha
    amax = observe_amax(stats, spec.calib_method, fmt, smoothing=s)
    entry.update(format="int8_w8a8" if fmt == "int8" else "fp8_w8a8", act_amax=amax)
    x = _smooth_input(graph, t, s, names)
    x = _fake_quant_activation(graph, t.node, x, amax, fmt, f"{prefix}.input", names)
    qw = formats.quantize_weight_per_channel(_scaled(w, s), fmt, spec.bound_pairs)
    qw = _rounded(qw, _scaled(w, s), stats, s, spec, entry)
    if fmt == "int8" and spec.bound_pairs:
        entry["bound_pairs"] = True
    _replace_weight(graph, t, x, qw, names)
    return entry


def _rounded(
    qw: formats.QuantizedWeight,
    w: np.ndarray,
    stats: TensorStats | None,
    s: np.ndarray | None,
    spec: QuantSpec,
    entry: dict,
) -> formats.QuantizedWeight:
    """``qw`` re-rounded by GPTQ (inputs ``X / s``) when ``spec`` asks for it; ``entry`` records
    the rounding used. With bounded int8 pairs, GPTQ codes that break the bound fall back to
    round-to-nearest (recorded as "nearest")."""
    entry["rounding"] = "nearest"
    if spec.weight_rounding != "gptq" or stats is None or stats.gram is None:
        return qw
    out = gptq_on_grid(w, qw, smoothed_hessian(stats.gram, s))
    if spec.bound_pairs and qw.data.dtype == np.int8 and not qw.block_size:
        if formats.max_pair_sum(out.data.astype(np.float32)).max() > formats.INT8_MAX + 1:
            return qw
    entry["rounding"] = "gptq"
    return out


def _scaled(w: np.ndarray, s: np.ndarray | None) -> np.ndarray:
    return w if s is None else w * s[:, None]


def _smooth_input(graph: ir.Graph, t: QuantTarget, s: np.ndarray | None, names: _Names) -> ir.Value:
    """X / s: folded into a preceding RMSNormalization's scale when possible, else a Mul."""
    x = t.node.inputs[0]
    if s is None:
        return x
    norm = x.producer()
    if (
        norm is not None
        and norm.op_type == "RMSNormalization"
        and len(norm.inputs) > 1
        and norm.inputs[1] is not None
        and norm.inputs[1].const_value is not None
        and len(x.uses()) == 1
        and not x.is_graph_output()
    ):
        gamma = norm.inputs[1].const_value.numpy()
        new = names.initializer(f"{t.module}.smoothed_norm_scale", (gamma / s).astype(gamma.dtype))
        norm.replace_input_with(1, new)
        return x
    inv = names.initializer(f"{t.module}.inv_smoothing", (1.0 / s).astype(np.float32))
    mul = ir.node("Mul", [x, inv], name=names.node(f"{t.module}/smooth"))
    graph.insert_before(t.node, mul)
    return mul.outputs[0]


def _fake_quant_activation(
    graph: ir.Graph, before: ir.Node, x: ir.Value, amax: float, fmt: str, prefix: str, names
) -> ir.Value:
    scale = names.initializer(
        f"{prefix}.scale", np.array(formats.activation_scale(amax, fmt), np.float32)
    )
    zp_dtype = np.int8 if fmt == "int8" else ml_dtypes.float8_e4m3fn
    zero = names.initializer(f"{prefix}.zero_point", np.zeros((), zp_dtype))
    q = ir.node("QuantizeLinear", [x, scale, zero], name=names.node(f"{prefix}/Q"))
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zero], name=names.node(f"{prefix}/DQ"))
    graph.insert_before(before, [q, dq])
    return dq.outputs[0]


def _replace_weight(
    graph: ir.Graph, t: QuantTarget, x: ir.Value, qw: formats.QuantizedWeight, names: _Names
) -> None:
    data = names.initializer(f"{t.module}.weight_quantized", qw.data)
    scale = names.initializer(f"{t.module}.weight_scale", qw.scale)
    inputs = [data, scale]
    attrs: dict = {"axis": qw.axis}
    if qw.block_size:
        attrs["block_size"] = qw.block_size  # zero point omitted: 0 (opset 21)
    else:
        inputs.append(names.initializer(f"{t.module}.weight_zero_point", np.zeros_like(qw.data[0])))
    dq = ir.node("DequantizeLinear", inputs, attrs, name=names.node(f"{t.module}/weight_DQ"))
    graph.insert_before(t.node, dq)
    t.node.replace_input_with(0, x)
    t.node.replace_input_with(1, dq.outputs[0])


def _set_kv_scales(graph: ir.Graph, stats: dict[str, TensorStats], spec: QuantSpec) -> dict:
    qmax = formats.FP8_MAX if spec.kv_cache_dtype == "fp8" else formats.INT8_MAX
    out = {}
    for node in _plugins(graph):
        layer = int(node.attributes["layer_idx"].as_int())
        k_amax = stats[kv_key(layer, "k")].absmax
        v_amax = stats[kv_key(layer, "v")].absmax
        k_scale, v_scale = max(k_amax, 1e-6) / qmax, max(v_amax, 1e-6) / qmax
        node.attributes["kv_cache_dtype"] = ir.AttrString("kv_cache_dtype", spec.kv_cache_dtype)
        node.attributes["k_scale"] = ir.AttrFloat32("k_scale", k_scale)
        node.attributes["v_scale"] = ir.AttrFloat32("v_scale", v_scale)
        out[str(layer)] = {"k_scale": k_scale, "v_scale": v_scale}
    return out


def _drop_dead(graph: ir.Graph) -> None:
    """Remove nodes whose outputs nobody reads (a tied projection's Transpose) and unused
    initializers (the float weights replaced by quantized ones)."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph)):
            if all(not o.uses() and not o.is_graph_output() for o in node.outputs):
                graph.remove(node, safe=True)
                changed = True
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and value not in graph.inputs:
            del graph.initializers[name]


class _Names:
    """Unique initializer and node names in one graph."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.used = set(graph.initializers) | {n.name for n in graph if n.name}
        self.used |= {v.name for n in graph for v in n.outputs if v.name}

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def initializer(self, base: str, array: np.ndarray) -> ir.Value:
        value = ir.Value(name=self._unique(base), const_value=ir.tensor(array))
        self.graph.register_initializer(value)
        return value

    def node(self, base: str) -> str:
        return self._unique(base)
