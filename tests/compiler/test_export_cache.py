"""The export cache: a checkpoint of a config exported before gets the graph a fresh export
gives, weights its own; the key moves with every input of the export and only with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx_ir as ir

from llmc.compiler.config.build_config import BuildConfig
from llmc.compiler.frontend.export_cache import UNBOUND, cached_export, export_key, source_digest
from llmc.compiler.frontend.onnx_export import LoRASlots, export_ir
from llmc.compiler.frontend.streamed_export import MetaModel, meta_model
from llmc.compiler.stages.load import resolve
from llmc.compiler.weights.checkpoint_weights import bind_initializers, index_safetensors
from tests.tiny_models import make_tiny_llama


def _meta(ckpt: Path) -> tuple[MetaModel, list[Path]]:
    src = resolve(BuildConfig.of(model=str(ckpt)).source).source
    return meta_model(src), src.weight_files


def _bound(graph: ir.Model, meta: MetaModel, files: list[Path]) -> bytes:
    bind_initializers(graph.graph, index_safetensors(files), meta.buffers, ir.DataType.FLOAT)
    return ir.to_proto(graph).SerializeToString()


def test_a_cached_graph_bound_to_a_checkpoint_is_the_fresh_export_of_it(tmp_path):
    first, _ = _meta(make_tiny_llama(tmp_path / "a", seed=1))
    second, files = _meta(make_tiny_llama(tmp_path / "b", seed=2))
    exports = []

    def export(meta: MetaModel):
        exports.append(meta)
        return export_ir(meta.model, 4)

    root = tmp_path / "exports"
    cached_export(first.model, 4, None, lambda: export(first), root)
    hit = cached_export(second.model, 4, None, lambda: export(second), root)
    assert exports == [first]  # the second checkpoint's graph came from the cache
    assert len(list(root.iterdir())) == 1
    fresh = export_ir(second.model, 4)
    assert _bound(hit, second, files) == _bound(fresh, second, files)


def test_the_key_moves_with_each_input_of_the_export_and_not_with_the_checkpoints_name(tmp_path):
    meta, _ = _meta(make_tiny_llama(tmp_path / "a"))
    key = export_key(meta.model, 4, None)
    elsewhere, _ = _meta(make_tiny_llama(tmp_path / "b", seed=3))  # another path, other weights
    assert export_key(elsewhere.model, 4, None) == key
    assert export_key(meta.model, 8, None) != key
    lora = LoRASlots(2, 4, ("q_proj", "v_proj"))
    assert export_key(meta.model, 4, lora) != key
    assert export_key(meta.model, 4, dataclasses.replace(lora, max_lora_rank=8)) != (
        export_key(meta.model, 4, lora)
    )
    meta.model.config.rms_norm_eps *= 2
    assert export_key(meta.model, 4, None) != key


def test_the_source_digest_moves_with_any_python_file(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not code")
    before = source_digest(package)
    (package / "notes.txt").write_text("still not code")
    assert source_digest(package) == before
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(package) != before
    (package / "sub" / "b.py").write_text("y = 2\n")
    assert source_digest(package) == before
    (package / "sub" / "b.py").rename(package / "b.py")  # the same bytes under another path
    assert source_digest(package) != before


def test_a_damaged_entry_is_exported_again(tmp_path):
    meta, _ = _meta(make_tiny_llama(tmp_path / "a"))
    root = tmp_path / "exports"

    def export() -> ir.Model:  # a one-node graph with one initializer stands for the export
        weight = ir.Value(name="w", shape=ir.Shape([2]), type=ir.TensorType(ir.DataType.FLOAT))
        weight.const_value = ir.tensor([1.0, 2.0], name="w")
        node = ir.node("Identity", [weight], num_outputs=1)
        graph = ir.Graph(
            [], node.outputs, nodes=[node], initializers=[weight], opset_imports={"": 23}
        )
        return ir.Model(graph, ir_version=10)

    cached_export(meta.model, 4, None, export, root)
    (entry,) = root.iterdir()
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2] + b"\xff\xff")
    graph = cached_export(meta.model, 4, None, export, root)
    (value,) = graph.graph.initializers.values()
    assert (value.name, value.shape, value.const_value.location) == ("w", ir.Shape([2]), UNBOUND)
