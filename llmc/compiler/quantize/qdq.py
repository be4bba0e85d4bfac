"""Write quantization into an engine graph as explicit, symmetric Q/DQ nodes (DESIGN §5).

Per target MatMul ``Y = X W`` (see ``targets.py``) the format of ``QuantSpec.quant`` (or, for
the modules matching ``QuantSpec.weight_only8``, the 8-bit weight-only format) computes a
``QuantizedLinear`` (``llmc.compiler.quantize.formats``), written here as
``X / s -> Q/DQ(activation grid, per-tensor) -> MatMul <- DQ(W * s on its grid)``, each part
present when the format gave it. Zero points are 0 everywhere. The smoothing factor s
(SmoothQuant or AWQ) is folded into the preceding RMSNormalization's scale when X is that norm's
only use, else an inserted Mul divides X by it. With ``kv_cache_dtype`` fp8/int8, every
PagedAttention node gets per-layer ``k_scale``/``v_scale`` from calibration (amax / 448 or
/ 127).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from llmc.calibration.observers import TensorStats
from llmc.compiler.quantize import microscaling_graph
from llmc.compiler.quantize.formats import FORMATS, WEIGHT_ONLY8
from llmc.compiler.quantize.matmul_targets import QuantTarget, find_targets, is_excluded
from llmc.compiler.quantize.tensor_spill import TensorSpill, drop_pages
from llmc.engine.plugin import DOMAIN, OP_TYPE
from llmc.quant.grids import FP8_E4M3, INT8, QuantizedWeight
from llmc.quant.microscaling import BlockActivationQuant, MicroscaledWeight
from llmc.quant.protocol import ActivationQuant, QuantFormat, QuantizedLinear, QuantSpec

#: The grid of each quantized KV-cache dtype (the scales of ``_set_kv_scales``).
_KV_GRIDS = {"fp8": FP8_E4M3, "int8": INT8}


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


def is_kv_key(key: str) -> bool:
    """``key`` is a KV-cache statistics key (``kv_key``), not a module's."""
    return key.startswith("kv_cache.")


def calibration_tensors(model: ir.Model, spec: QuantSpec) -> dict[str, str]:
    """The statistics ``quantize_graph`` needs for ``spec``: {key: tensor name}. Keys are stable
    across exports (checkpoint module names, ``kv_cache.<layer>.k|v``); tensor names are not
    (the exporter numbers them in trace order, which for Gemma 3 depends on the hash seed)."""
    gptq = spec.weight_rounding == "gptq"
    names = {
        t.module: t.activation
        for t in find_targets(model)
        if not kept_float(t.module, spec) and (gptq or _format(t, spec).needs_stats)
    }
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
    return frozenset(t.module for t in find_targets(model) if not kept_float(t.module, spec))


def _plugins(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph if n.domain == DOMAIN and n.op_type == OP_TYPE]


def kept_float(module: str, spec: QuantSpec) -> bool:
    """``module`` stays float: it matches ``spec.exclude`` or its assignment is "none"."""
    return is_excluded(module, spec.exclude) or dict(spec.assignment).get(module) == "none"


def base_format(module: str, spec: QuantSpec) -> str:
    """The format name a module gets without an assignment: 8-bit weight-only where
    ``weight_only8`` says, else ``spec.quant``."""
    return WEIGHT_ONLY8 if is_excluded(module, spec.weight_only8) else spec.quant


def _format(t: QuantTarget, spec: QuantSpec) -> QuantFormat:
    """The format of one (not kept float) target: its ``spec.assignment`` entry, else
    ``base_format``."""
    return FORMATS[dict(spec.assignment).get(t.module) or base_format(t.module, spec)]


def quantize_graph(model: ir.Model, stats: dict[str, TensorStats], spec: QuantSpec) -> QuantReport:
    """Rewrite ``model`` in place; ``stats`` are the calibration statistics of
    ``calibration_tensors(model, spec)``, by key. Raises ValueError on an unknown format or a tensor
    without statistics."""
    quantizer = GraphQuantizer(model, spec)
    quantizer.quantize(stats)
    return quantizer.finish()


class GraphQuantizer:
    """Quantize a graph's targets in parts, as their statistics become available (a build that
    calibrates one segment at a time quantizes that segment's modules and drops their
    statistics before calibrating the next), then finish with the KV-cache scales.

    Each target's float weight is read when it is quantized and released after
    (``QuantTarget.release``), so a streamed graph's float weights are never all in memory;
    with a ``spill``, the quantized weights go to its file as they are made, so the quantized
    ones are not either. ``precomputed`` holds ``QuantizedLinear``s already made, by (module,
    format name) (``--accuracy-target`` quantizes every module in each candidate format while
    its statistics are in memory); they are written as they are. Raises ValueError on an
    unknown format."""

    def __init__(
        self,
        model: ir.Model,
        spec: QuantSpec,
        spill: TensorSpill | None = None,
        precomputed: dict[tuple[str, str], QuantizedLinear] | None = None,
    ):
        if spec.quant not in FORMATS or not FORMATS[spec.quant].quantizes:
            raise ValueError(f"cannot quantize to {spec.quant!r}")
        self.model, self.spec = model, spec
        self.report = QuantReport(spec=spec.__dict__ | {"exclude": list(spec.exclude)})
        self._counts: Counter = Counter()
        self._names = UniqueNames(model.graph, spill)
        self._pending = {t.module: t for t in find_targets(model)}
        self._kv_stats: dict[str, TensorStats] = {}
        self._precomputed = precomputed or {}

    def quantize(self, stats: dict[str, TensorStats]) -> None:
        """Quantize the pending targets ``stats`` has statistics for (by module key), and keep
        its KV-cache statistics (``kv_key``) for ``finish``."""
        self._kv_stats.update({k: s for k, s in stats.items() if is_kv_key(k)})
        self._quantize(stats, set(stats) | {m for m, _ in self._precomputed})

    def _quantize(self, stats: dict[str, TensorStats], modules: set[str] | None) -> None:
        """Quantize the pending targets among ``modules`` (None: all pending). Raises
        ValueError for a target whose format needs statistics not in ``stats``."""
        spec = self.spec
        for module, target in list(self._pending.items()):
            if modules is not None and module not in modules:
                continue
            del self._pending[module]
            if kept_float(module, spec):
                self.report.excluded.append(module)
                continue
            fmt = _format(target, spec)
            ql = self._precomputed.get((module, fmt.name))
            if ql is None:
                if fmt.needs_stats and module not in stats:
                    raise ValueError(f"no calibration statistics for {module!r}")
                ql = fmt.quantize(target.weight_for(fmt), stats.get(module), spec)
            target.release()
            emulated = fmt.cpu_weight(ql.weight) if spec.cpu_weights else None
            write_linear(self.model.graph, target, ql, self._names, emulated)
            drop_pages(ql.weight.data)  # a spilled precomputed form, copied into the spill
            drop_pages(ql.smoothing)
            entry = {"shape": list(target.shape), **ql.record}
            entry.setdefault("format", fmt.label)
            self.report.modules[module] = entry
            self._counts[fmt.label] += 1

    def finish(self) -> QuantReport:
        """Quantize what is still pending (formats that need no statistics; ValueError for one
        that does), set the KV-cache scales from the kept statistics (``kv_cache_dtype`` fp8 or
        int8), drop the float weights no node reads, and return the report."""
        self._quantize({}, None)
        if self.spec.kv_cache_dtype in ("fp8", "int8"):
            self.report.kv_cache = _set_kv_scales(self.model.graph, self._kv_stats, self.spec)
        drop_dead(self.model.graph)
        self.report.counts = dict(sorted(self._counts.items()))
        return self.report


def write_linear(
    graph: ir.Graph,
    t: QuantTarget,
    ql: QuantizedLinear,
    names: UniqueNames,
    cpu_weight: np.ndarray | None = None,
) -> None:
    """Q/DQ nodes around ``t``'s MatMul as ``ql`` says: smoothing, activation Q/DQ, weight DQ;
    with ``cpu_weight`` (``QuantFormat.cpu_weight``), that float32 weight instead of the
    weight's DQ."""
    x = _smooth_input(graph, t, ql.smoothing, names)
    if ql.activation is not None:
        x = _fake_quant_activation(graph, t.node, x, ql.activation, f"{t.module}.input", names)
    if cpu_weight is None:
        _replace_weight(graph, t, x, ql.weight, names)
        return
    t.node.replace_input_with(0, x)
    t.node.replace_input_with(1, names.initializer(f"{t.module}.weight_emulated", cpu_weight))


def _smooth_input(
    graph: ir.Graph, t: QuantTarget, s: np.ndarray | None, names: UniqueNames
) -> ir.Value:
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
    graph: ir.Graph, before: ir.Node, x: ir.Value, act: ActivationQuant, prefix: str, names
) -> ir.Value:
    if isinstance(act, BlockActivationQuant):  # NVFP4, MXFP8: TensorRT's dynamic quantizers
        return microscaling_graph.write_activation(graph, before, x, act, prefix, names)
    grid = act.grid
    scale = names.initializer(f"{prefix}.scale", np.array(grid.scale(act.amax), np.float32))
    zero = names.initializer(f"{prefix}.zero_point", np.zeros((), grid.dtype))
    q = ir.node("QuantizeLinear", [x, scale, zero], name=names.node(f"{prefix}/Q"))
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zero], name=names.node(f"{prefix}/DQ"))
    graph.insert_before(before, [q, dq])
    return dq.outputs[0]


def _replace_weight(
    graph: ir.Graph, t: QuantTarget, x: ir.Value, qw: QuantizedWeight, names: UniqueNames
) -> None:
    if isinstance(qw, MicroscaledWeight):  # NVFP4, MXFP8: their two-level or E8M0 scales
        w = microscaling_graph.write_weight(graph, t.node, t.module, qw, names)
        t.node.replace_input_with(0, x)
        t.node.replace_input_with(1, w)
        return
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
    qmax = _KV_GRIDS[spec.kv_cache_dtype].qmax
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


def drop_dead(graph: ir.Graph) -> None:
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


class UniqueNames:
    """Unique initializer and node names in one graph; new initializers' large arrays go to
    ``spill`` when one is given."""

    def __init__(self, graph: ir.Graph, spill: TensorSpill | None = None):
        self.graph, self.spill = graph, spill
        self.used = set(graph.initializers) | {n.name for n in graph if n.name}
        self.used |= {v.name for n in graph for v in n.outputs if v.name}

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def initializer(self, base: str, array: np.ndarray) -> ir.Value:
        name = self._unique(base)
        tensor = self.spill.tensor(array, name) if self.spill else ir.tensor(array, name=name)
        value = ir.Value(name=name, const_value=tensor)
        self.graph.register_initializer(value)
        return value

    def node(self, base: str) -> str:
        return self._unique(base)
