"""Which ONNX Runtime graph form computes a LoRA engine's per-token adapter deltas fastest: the
dense form llmc builds (``llmc.engine.lora``: every slot's ``X @ A`` at once, a per-token slot
mask, one ``@ B``) against Punica's gather form (BGMV: each token's own A and B gathered from
the stacked slots, then batched MatMuls).

    python benchmarks/bench_lora_forms.py --json forms.json

One projection of Gemma 3 270M's shape by default (K 640 -> O 2048, the gate/up projection),
``--slots`` 4 of rank ``--rank`` 16, tokens T in ``--tokens`` (decode batches and prefill
chunks), each token on a random slot; both forms checked equal to numpy first. Times are the
median of ``--repeats`` runs of each graph alone, one ORT intra-op thread per core, with the base
projection ``X @ W`` beside them for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import onnx
from onnx import TensorProto, helper


def _graph(nodes, inputs, name: str) -> onnx.ModelProto:
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, name, inputs, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10  # ONNX Runtime reads up to its own IR version
    return model


def _inputs(k: int, o: int, n: int, r: int, dense: bool) -> list:
    f, i = TensorProto.FLOAT, TensorProto.INT64
    a_shape, b_shape = ([k, n * r], [n * r, o]) if dense else ([n, k, r], [n, r, o])
    return [
        helper.make_tensor_value_info("x", f, ["T", k]),
        helper.make_tensor_value_info("slot", i, ["T"]),
        helper.make_tensor_value_info("a", f, a_shape),
        helper.make_tensor_value_info("b", f, b_shape),
    ]


def dense_form(k: int, o: int, n: int, r: int) -> onnx.ModelProto:
    """(X @ A_all).reshape(T, N, R) * onehot(slot)[..., None] -> reshape(T, N*R) @ B_all."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Constant", [], ["slots"], value=c("s", TensorProto.INT64, [n], range(n))),
        helper.make_node("Constant", [], ["one"], value=c("o", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["s3"], value=c("s3", TensorProto.INT64, [3], [-1, n, r])),
        helper.make_node(
            "Constant", [], ["s2"], value=c("s2", TensorProto.INT64, [2], [-1, n * r])
        ),
        helper.make_node("Unsqueeze", ["slot", "one"], ["slot_col"]),
        helper.make_node("Equal", ["slot_col", "slots"], ["hit"]),
        helper.make_node("Cast", ["hit"], ["mask2"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["two"], value=c("t", TensorProto.INT64, [1], [2])),
        helper.make_node("Unsqueeze", ["mask2", "two"], ["mask"]),
        helper.make_node("MatMul", ["x", "a"], ["xa"]),
        helper.make_node("Reshape", ["xa", "s3"], ["xa3"]),
        helper.make_node("Mul", ["xa3", "mask"], ["xm"]),
        helper.make_node("Reshape", ["xm", "s2"], ["xm2"]),
        helper.make_node("MatMul", ["xm2", "b"], ["y"]),
    ]
    return _graph(nodes, _inputs(k, o, n, r, True), "dense")


def gather_form(k: int, o: int, n: int, r: int) -> onnx.ModelProto:
    """Punica's BGMV: A[slot] [T, K, R], B[slot] [T, R, O]; x [T, 1, K] @ A -> @ B. Slot -1
    (the base model) is clamped to a zero slot N appended to the stacks by the caller."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Constant", [], ["one"], value=c("o", TensorProto.INT64, [1], [1])),
        helper.make_node("Gather", ["a", "slot"], ["at"], axis=0),
        helper.make_node("Gather", ["b", "slot"], ["bt"], axis=0),
        helper.make_node("Unsqueeze", ["x", "one"], ["x3"]),
        helper.make_node("MatMul", ["x3", "at"], ["xa"]),
        helper.make_node("MatMul", ["xa", "bt"], ["y3"]),
        helper.make_node("Squeeze", ["y3", "one"], ["y"]),
    ]
    return _graph(nodes, _inputs(k, o, n + 1, r, False), "gather")


def base_form(k: int, o: int) -> onnx.ModelProto:
    """The base projection X @ W, for scale."""
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, o]),
    ]
    return _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs, "base")


def _median_ms(session, feed: dict, repeats: int) -> float:
    session.run(None, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def measure(args: argparse.Namespace) -> list[dict]:
    """Per T: each form's median time (ms), after checking both against numpy."""
    import onnxruntime as ort

    k, o, n, r = args.k, args.o, args.slots, args.rank
    rng = np.random.default_rng(0)
    a = rng.normal(0, 0.05, (n, k, r)).astype(np.float32)
    b = rng.normal(0, 0.05, (n, r, o)).astype(np.float32)
    w = rng.normal(0, 0.05, (k, o)).astype(np.float32)
    a_all = np.ascontiguousarray(a.transpose(1, 0, 2).reshape(k, n * r))
    b_all = np.ascontiguousarray(b.reshape(n * r, o))
    a_z = np.concatenate([a, np.zeros((1, k, r), np.float32)])
    b_z = np.concatenate([b, np.zeros((1, r, o), np.float32)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    sessions = {
        name: ort.InferenceSession(model.SerializeToString(), opts, ["CPUExecutionProvider"])
        for name, model in [
            ("dense", dense_form(k, o, n, r)),
            ("gather", gather_form(k, o, n, r)),
            ("base", base_form(k, o)),
        ]
    }
    rows = []
    for t in args.tokens:
        x = rng.normal(0, 1, (t, k)).astype(np.float32)
        slot = rng.integers(-1, n, t).astype(np.int64)
        ref = np.stack([x[i] @ a[s] @ b[s] if s >= 0 else np.zeros(o) for i, s in enumerate(slot)])
        dense = {"x": x, "slot": slot, "a": a_all, "b": b_all}
        gather = {"x": x, "slot": np.where(slot < 0, n, slot), "a": a_z, "b": b_z}
        for name, feed in (("dense", dense), ("gather", gather)):
            got = sessions[name].run(None, feed)[0]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        row = {"tokens": t}
        for name, feed in (("dense", dense), ("gather", gather), ("base", {"x": x, "w": w})):
            row[f"{name}_ms"] = _median_ms(sessions[name], feed, args.repeats)
        rows.append(row)
        ratio = row["gather_ms"] / row["dense_ms"]
        print(
            f"T {t:5d}: dense {row['dense_ms']:8.3f} ms  gather {row['gather_ms']:8.3f} ms  "
            f"base X@W {row['base_ms']:8.3f} ms  gather/dense {ratio:5.2f}",
            flush=True,
        )
    return rows


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=640, help="projection input features")
    parser.add_argument("--o", type=int, default=2048, help="projection output features")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256, 2048])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rows = measure(args)
    if args.json:
        record = {"host": platform.processor() or platform.machine(), "args": vars(args)}
        with open(args.json, "w") as f:
            json.dump(record | {"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
