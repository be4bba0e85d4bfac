"""ONNX Runtime's RMS norm kernels against llmc's, alone: 36 chained nodes on [1, T, hidden] in one
session per kind, median microseconds per node.

    python benchmarks/bench_cpu_norms.py [--hidden 640] [--tokens 1,16,128] [--runs 50]

Kinds: ``ort-skip`` (com.microsoft SkipSimplifiedLayerNormalization), ``llmc-skip``
(llmc::SkipRMSNorm), ``ort`` (SimplifiedLayerNormalization), ``llmc`` (llmc::RMSNorm). Also prints
the largest relative difference of each llmc kind's outputs from ONNX Runtime's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from bench_build_scale import host_line  # benchmarks/ is the script's directory
from onnx import TensorProto, helper, numpy_helper

from llmc.plugins.paged_attention import ort_op
from llmc.runtime.runners.ort_env import session_options

NODES = 36
KINDS = {
    "ort-skip": ("SkipSimplifiedLayerNormalization", "com.microsoft", True),
    "llmc-skip": ("SkipRMSNorm", "llmc", True),
    "ort": ("SimplifiedLayerNormalization", "", False),
    "llmc": ("RMSNorm", "llmc", False),
}


def chain(kind: str, hidden: int) -> onnx.ModelProto:
    """NODES norms of kind, each normalizing the previous one's output (plus r for the skip
    kinds)."""
    op, domain, skip = KINDS[kind]
    nodes, prev = [], "x"
    for i in range(NODES):
        if skip:
            outputs = (
                [f"y{i}", "", "", f"h{i}"] if domain == "com.microsoft" else [f"y{i}", f"h{i}"]
            )
            nodes.append(
                helper.make_node(op, [prev, "r", "w"], outputs, domain=domain, epsilon=1e-6)
            )
        else:
            nodes.append(helper.make_node(op, [prev, "w"], [f"y{i}"], domain=domain, epsilon=1e-6))
        prev = f"y{i}"
    inputs = ["x", "r"] if skip else ["x"]
    outputs = [prev, f"h{NODES - 1}"] if skip else [prev]
    weight = np.random.default_rng(0).uniform(0.5, 1.5, hidden).astype(np.float32)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "T", hidden]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(weight, "w")],
    )
    opsets = [helper.make_opsetid(d, 1) for d in ("com.microsoft", "llmc")]
    opsets.append(helper.make_opsetid("", 23))
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def main() -> None:
    """Print the host, then per token count T each kind's median microseconds per node (wall
    time of ``--runs`` session runs over NODES nodes) and the llmc kinds' largest relative output
    difference from ONNX Runtime's. Exits with a message if the custom-op library is not built."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--tokens", default="1,16,128")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    options = session_options(2)
    if not ort_op.register(options):
        raise SystemExit("the custom-op library is not built (pip install -e .)")
    print(host_line())
    for tokens in (int(t) for t in args.tokens.split(",")):
        rng = np.random.default_rng(tokens)
        feeds = {n: rng.standard_normal((1, tokens, args.hidden)).astype(np.float32) for n in "xr"}
        outputs = {}
        for kind in KINDS:
            session = ort.InferenceSession(
                chain(kind, args.hidden).SerializeToString(), options, ["CPUExecutionProvider"]
            )
            feed = feeds if KINDS[kind][2] else {"x": feeds["x"]}
            outputs[kind] = session.run(None, feed)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - start)
            per_node = statistics.median(times) / NODES * 1e6
            print(f"T={tokens:4d} {kind:10s} {per_node:8.1f} us per node")
        for ours, theirs in (("llmc-skip", "ort-skip"), ("llmc", "ort")):
            diff = max(
                float(np.abs(a - b).max() / np.abs(b).max())
                for a, b in zip(outputs[ours], outputs[theirs], strict=True)
            )
            print(f"T={tokens:4d} {ours} against {theirs}: max relative difference {diff:.1e}")


if __name__ == "__main__":
    main()
