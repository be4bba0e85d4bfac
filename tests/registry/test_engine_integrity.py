"""Issue 17 item 7: an engine directory is checked file by file before anything is deserialized.

One tiny Llama engine is built per module and copied for each test; the copy is tampered with
(most tampering rewrites the manifest's digests to match, as an attacker with write access
would) and ``load_engine`` must refuse it with ``EngineCorruptError`` naming the file, while ONNX
Runtime and the tokenizer are never reached. The untampered copy loads and generates.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from llmc.engine.manifest import file_digests, read_manifest, write_manifest
from llmc.errors import EngineCorruptError
from llmc.runtime.runners.engine_loader import load_engine
from tests.tiny_models import make_tiny_llama

SEGMENT = "segments/segment_000.onnx"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmc.compiler.build import build
    from llmc.compiler.config.build_config import BuildConfig

    tmp = tmp_path_factory.mktemp("integrity")
    checkpoint = make_tiny_llama(tmp / "checkpoint")
    out = str(tmp / "engine")
    config = BuildConfig.of(model=str(checkpoint), block_size=16, max_seq_len=64, output=out)
    return build(config).engine_dir


@pytest.fixture
def engine(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "engine"))


@pytest.fixture
def nothing_deserialized(monkeypatch):
    """Fail the test if ONNX Runtime or the tokenizer is asked to load anything."""
    import onnxruntime
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("an engine file was deserialized before the check refused it")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def redigest(engine: Path, files: dict[str, str] | None = None) -> None:
    """Rewrite the manifest to match the directory (or list ``files``), as an attacker would."""
    m = read_manifest(engine)
    write_manifest(replace(m, files=file_digests(engine) if files is None else files), engine)


def refused(engine: Path, *fragments: str) -> str:
    with pytest.raises(EngineCorruptError) as raised:
        load_engine(engine, num_blocks=8)
    message = str(raised.value)
    for fragment in fragments:
        assert fragment in message
    assert "llmc build" in message  # says what to rebuild
    return message


def weights_file(engine: Path) -> str:
    return next(f for f in read_manifest(engine).files if f.endswith(".onnx.data"))


def test_untampered_copy_loads_and_generates(engine: Path):
    from llmc.runtime.llm import LLM
    from llmc.runtime.sampling_params import SamplingParams

    # Random weights may draw EOS first; ignore_eos makes the length the engine's, not the draw's.
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    out = LLM(engine, num_blocks=16).generate(["To be"], params)
    assert len(out[0].outputs[0].token_ids) == 4


def test_build_lists_every_file(engine: Path):
    listed = read_manifest(engine).files
    on_disk = sorted(p.relative_to(engine).as_posix() for p in engine.rglob("*") if p.is_file())
    assert sorted(listed) == [f for f in on_disk if f != "manifest.json"]
    assert {"plan.json", "engine.onnx", SEGMENT, "generation_config.json"} <= listed.keys()


def test_manifest_listing_no_files(engine: Path, nothing_deserialized):
    redigest(engine, files={})
    refused(engine, "manifest.json lists no engine files")


@pytest.mark.parametrize("dropped", ["plan.json", "engine.onnx", "tokenizer/tokenizer.json"])
def test_file_dropped_from_manifest(engine: Path, dropped: str, nothing_deserialized):
    files = read_manifest(engine).files
    redigest(engine, files={k: v for k, v in files.items() if k != dropped})
    refused(engine, f"engine/{dropped} is not in the manifest")


def test_extra_unlisted_file(engine: Path, nothing_deserialized):
    (engine / "segments" / "extra.onnx").write_bytes(b"not listed")
    refused(engine, "segments/extra.onnx is not in the manifest", "remove it if")
    # Skipping the hashes does not skip the listing.
    with pytest.raises(EngineCorruptError, match="extra.onnx is not in the manifest"):
        load_engine(engine, num_blocks=8, verify_digests=False)


def test_listed_file_missing(engine: Path, nothing_deserialized):
    (engine / SEGMENT).unlink()
    refused(engine, f"{SEGMENT} (in the manifest) is missing")


@pytest.mark.parametrize("damage", ["zeroed", "flipped"])
def test_damaged_weights(engine: Path, damage: str, nothing_deserialized):
    path = engine / weights_file(engine)
    data = bytearray(path.read_bytes())
    if damage == "zeroed":
        data = bytearray(len(data))
    else:
        data[len(data) // 2] ^= 0x01
    path.write_bytes(data)
    refused(engine, str(path.relative_to(engine)), "has sha256", "but the manifest expects")


@pytest.mark.parametrize("outside", ["../x.onnx", "/etc/passwd", "segments/../../x.onnx", ""])
def test_plan_points_outside(engine: Path, tmp_path: Path, outside: str, nothing_deserialized):
    shutil.copyfile(engine / SEGMENT, tmp_path / "x.onnx")  # a real graph, out of the engine
    plan = json.loads((engine / "plan.json").read_text())
    plan["segments"][0]["file"] = outside
    (engine / "plan.json").write_text(json.dumps(plan))
    redigest(engine)
    refused(engine, "plan.json names the path", repr(outside))


def test_plan_names_an_unlisted_graph(engine: Path, nothing_deserialized):
    plan = json.loads((engine / "plan.json").read_text())
    plan["graph"] = "segments/nowhere.onnx"
    (engine / "plan.json").write_text(json.dumps(plan))
    redigest(engine)
    refused(engine, "plan.json names 'segments/nowhere.onnx', which the manifest does not list")


def test_manifest_lists_a_path_outside(engine: Path, nothing_deserialized):
    files = read_manifest(engine).files
    for outside in ("../x", "/etc/passwd", "./plan.json"):
        redigest(engine, files={**files, outside: "0" * 64})
        refused(engine, "manifest.json names the path", repr(outside))


@pytest.mark.parametrize(
    ("graph", "location"),
    [(SEGMENT, "../../etc/passwd"), (SEGMENT, "/etc/passwd"), ("engine.onnx", "../x.data")],
)
def test_external_data_outside(engine: Path, graph: str, location: str, nothing_deserialized):
    model = onnx.load(str(engine / graph), load_external_data=False)
    external = onnx.TensorProto.EXTERNAL
    tensor = next(t for t in model.graph.initializer if t.data_location == external)
    entry = next(e for e in tensor.external_data if e.key == "location")
    entry.value = location
    onnx.save(model, str(engine / graph))
    redigest(engine)
    refused(engine, f"engine/{graph}: the external data of tensor {tensor.name!r}", repr(location))


def test_symlink_to_an_identical_file_outside(engine: Path, tmp_path: Path, nothing_deserialized):
    """Same bytes, so the digest matches: only the link's target gives it away."""
    link = engine / "tokenizer" / "tokenizer.json"
    outside = shutil.copyfile(link, tmp_path / "tokenizer.json")
    link.unlink()
    link.symlink_to(outside)
    refused(engine, "'tokenizer/tokenizer.json'", f"resolves to {outside.resolve()}, outside")


def test_symlinked_folder_outside(engine: Path, tmp_path: Path, nothing_deserialized):
    outside = shutil.move(engine / "tokenizer", tmp_path / "tokenizer")
    (engine / "tokenizer").symlink_to(outside)
    refused(engine, "'tokenizer/", "outside the engine directory")


def test_poisoned_registry_checkout(engine: Path, tmp_path: Path):
    """A checkout is reused once assembled: edits made to it later are refused at serve time."""
    from llmc.registry.local import LocalRegistry
    from llmc.registry.resolve import engine_dir_for
    from llmc.registry.signing import generate_keypair, sign_entry

    key = tmp_path / "key"
    pub = generate_keypair(key)
    registry = LocalRegistry(tmp_path / "registry")
    entry = registry.publish(engine)
    registry.add(replace(entry, signature=sign_entry(entry, key)))
    model = read_manifest(engine).model_id
    checkout = engine_dir_for(model, registry.root, pub).path
    load_engine(checkout, num_blocks=8)  # the good checkout loads

    # Poison a weights file and rewrite the checkout's manifest to match it.
    weights = checkout / weights_file(checkout)
    data = bytearray(weights.read_bytes())
    weights.unlink()  # a hard link to a read-only blob: replace it, as an attacker would
    weights.write_bytes(bytes(len(data)))
    (checkout / "manifest.json").unlink()
    write_manifest(replace(read_manifest(engine), files=file_digests(checkout)), checkout)
    with pytest.raises(EngineCorruptError, match="was altered: its manifest.json hashes to"):
        engine_dir_for(model, registry.root, pub)
    with pytest.raises(EngineCorruptError, match="was altered"):
        engine_dir_for(model, registry.root)  # without a key the index's digest still holds

    # Restore the manifest but leave the weights poisoned: the loader refuses the file.
    (checkout / "manifest.json").unlink()
    shutil.copyfile(engine / "manifest.json", checkout / "manifest.json")
    assert engine_dir_for(model, registry.root, pub).path == checkout
    with pytest.raises(EngineCorruptError, match="has sha256 .* but the manifest expects"):
        load_engine(checkout, num_blocks=8)


def test_manifest_swapped_between_resolve_and_load(engine: Path, tmp_path: Path):
    """``engine_dir_for`` checked the checkout's manifest; one swapped in before the load (for
    zeroed weights, its digests rewritten to match) loads unless the resolved digest is passed."""
    from llmc.registry.local import LocalRegistry
    from llmc.registry.resolve import engine_dir_for
    from llmc.runtime.llm import LLM

    registry = LocalRegistry(tmp_path / "registry")
    entry = registry.publish(engine)
    resolved = engine_dir_for(entry.model_id, registry.root)
    checkout = resolved.path
    weights = checkout / weights_file(checkout)
    size = weights.stat().st_size
    weights.unlink()  # a hard link to a read-only blob: replace it, as an attacker would
    weights.write_bytes(bytes(size))
    (checkout / "manifest.json").unlink()
    write_manifest(replace(read_manifest(engine), files=file_digests(checkout)), checkout)
    with pytest.raises(EngineCorruptError, match="replaced after it was checked"):
        LLM(checkout, num_blocks=8, expected_manifest_sha256=resolved.manifest_sha256)
    load_engine(checkout, num_blocks=8)  # without it, the poisoned engine loads
