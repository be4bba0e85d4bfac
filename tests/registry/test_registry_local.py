"""The local registry on synthetic engine directories (manifest + files, no model): blob layout,
index keys, concurrent publishers, resolve reasons, integrity, signatures, rm and gc."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from dataclasses import replace
from pathlib import Path

import onnxruntime as ort
import pytest

from llmc.cli import main
from llmc.compiler.config.build_config import BuildConfig
from llmc.engine.files import verify_engine_files
from llmc.engine.isa import FEATURES, detect_host_isa
from llmc.engine.manifest import EngineManifest, file_digests, read_manifest, write_manifest
from llmc.errors import (
    BlobCorruptError,
    EngineCorruptError,
    NoMatchingEngineError,
    RegistryError,
    SignatureError,
)
from llmc.registry.entry import check_entry_agrees
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import engine_dir_for, resolve_local
from llmc.registry.signing import generate_keypair, sign_entry
from llmc.runtime.runners.engine_loader import load_engine

SHARED = b"shared tokenizer bytes\n" * 10


def fake_engine(root: Path, model_id: str = "toy", payload: bytes = b"weights", **fields) -> Path:
    """An engine directory this host would run: files plus a manifest listing their digests."""
    (root / "tokenizer").mkdir(parents=True)
    (root / "model.onnx").write_bytes(payload)
    (root / "tokenizer" / "tokenizer.json").write_bytes(SHARED)
    host = detect_host_isa()
    values = dict(
        model_id=model_id,
        source=model_id,
        checkpoint_digest="a" * 64,
        tokenizer_digest="b" * 64,
        target="cpu",
        isa=[],
        arch=host.arch,
        dtype="float32",
        quant="none",
        kv_cache_dtype="float32",
        max_seq_len=64,
        max_num_tokens=64,
        max_batch=2,
        block_size=4,
        num_layers=1,
        num_kv_heads=1,
        head_dim=8,
        vocab_size=16,
        backend="onnxruntime",
        backend_version=ort.__version__,
        execution_provider="CPUExecutionProvider",
        build_config_hash="c" * 64,
        created_at="2026-01-01T00:00:00+00:00",
    )
    values.update(fields)
    write_manifest(EngineManifest(**values, files=file_digests(root)), root)
    return root


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_publish_stores_blobs_by_sha256_and_indexes(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e", payload=b"W" * 1000))
    manifest_raw = (tmp_path / "e" / "manifest.json").read_bytes()
    assert entry.manifest_digest == sha(manifest_raw)
    assert entry.files == {"model.onnx": sha(b"W" * 1000), "tokenizer/tokenizer.json": sha(SHARED)}
    for data in (b"W" * 1000, SHARED, manifest_raw):
        blob = tmp_path / "reg" / "blobs" / "sha256" / sha(data)[:2] / sha(data)
        assert blob.read_bytes() == data
        assert blob.stat().st_mode & 0o777 == 0o444
    index = json.loads((tmp_path / "reg" / "index.json").read_text())
    assert [e["manifest_digest"] for e in index["entries"]] == [sha(manifest_raw)]
    assert entry.size_bytes == 1000 + len(SHARED) + len(manifest_raw)
    checkout = reg.checkout(entry)
    assert (checkout / "model.onnx").read_bytes() == b"W" * 1000
    assert (checkout / "manifest.json").read_bytes() == manifest_raw


def test_same_key_replaces_other_keys_coexist_blobs_shared(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    first = reg.publish(fake_engine(tmp_path / "a", payload=b"v1"))
    rebuilt = reg.publish(fake_engine(tmp_path / "b", payload=b"v2"))  # same key, new bytes
    int4 = reg.publish(fake_engine(tmp_path / "c", payload=b"v3", quant="int4"))
    assert first.key == rebuilt.key != int4.key
    assert [e.manifest_digest for e in reg.entries()] == [
        rebuilt.manifest_digest,
        int4.manifest_digest,
    ]
    # one tokenizer blob for all three; model blobs v1, v2, v3; three manifests
    assert len(list(reg.blobs.digests())) == 1 + 3 + 3


def _publish_many(root: str, worker: int, count: int, scratch: str) -> None:
    reg = LocalRegistry(Path(root))
    for i in range(count):
        d = Path(scratch) / f"w{worker}-{i}"
        reg.publish(fake_engine(d, model_id=f"m{worker}-{i}", payload=f"{worker}/{i}".encode()))


def test_concurrent_publishers_lose_no_entry(tmp_path: Path):
    workers, count = 6, 5
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_publish_many, args=(tmp_path / "reg", w, count, tmp_path))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    reg = LocalRegistry(tmp_path / "reg")
    ids = sorted(e.model_id for e in reg.entries())
    assert ids == sorted(f"m{w}-{i}" for w in range(workers) for i in range(count))
    assert reg.verify() == []
    assert not list((tmp_path / "reg").glob("**/*.partial"))


def test_resolve_refuses_foreign_isa_and_backend_with_reasons(tmp_path: Path):
    host = detect_host_isa()
    lacking = next(f for f in FEATURES if f not in host.features)
    reg = LocalRegistry(tmp_path / "reg")
    reg.publish(fake_engine(tmp_path / "isa", isa=[lacking], build_config_hash="1" * 64))
    reg.publish(fake_engine(tmp_path / "ort", backend_version="1.99.0", build_config_hash="2" * 64))
    reg.publish(fake_engine(tmp_path / "gpu", target="sm90", build_config_hash="3" * 64))
    with pytest.raises(NoMatchingEngineError) as raised:
        resolve_local(reg, "toy")
    message = str(raised.value)
    assert f"fits this host ({host.name}" in message
    lines = message.splitlines()[1:]
    assert len(lines) == 3
    isa_line = next(line for line in lines if f"/{lacking} " in line)
    assert f"needs {lacking}, which this host" in isa_line
    ort_line = next(line for line in lines if "1.99.0" in line.split(":")[0])
    assert f"built with onnxruntime 1.99.0 but {ort.__version__} is installed" in ort_line
    assert "engine built for sm90" in next(line for line in lines if " sm90/" in line)

    good = reg.publish(fake_engine(tmp_path / "good", build_config_hash="4" * 64))
    assert resolve_local(reg, "toy") == good
    with pytest.raises(NoMatchingEngineError, match="quant is none, asked for --quant int4"):
        from llmc.registry.resolve import Selection

        resolve_local(reg, "toy", Selection(quant="int4"))


def test_tampered_blob_refused_by_verify_and_load_with_its_digest(tmp_path: Path, capsys):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e", payload=b"0123456789" * 50))
    checkout = reg.checkout(entry)
    digest = entry.files["model.onnx"]
    blob = reg.blobs.path(digest)
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[100] ^= 0x01
    blob.write_bytes(bytes(data))
    problems = reg.verify()
    assert len(problems) == 1 and f"blob sha256:{digest}" in problems[0].message
    assert main(["registry", "verify", "--registry", str(tmp_path / "reg")]) == 1
    assert f"sha256:{digest}" in capsys.readouterr().err
    with pytest.raises(EngineCorruptError, match=f"manifest expects {digest}"):
        load_engine(checkout)  # the checkout shares the blob's inode


def test_publish_refuses_file_differing_from_manifest(tmp_path: Path):
    engine = fake_engine(tmp_path / "e")
    (engine / "model.onnx").write_bytes(b"changed after the build")
    reg = LocalRegistry(tmp_path / "reg")
    with pytest.raises(BlobCorruptError, match=sha(b"weights")):
        reg.publish(engine)
    assert reg.entries() == []
    assert sha(b"weights") not in set(reg.blobs.digests())
    assert not list((tmp_path / "reg").glob("**/.*.partial"))


def test_signatures_valid_wrong_key_tampered_unsigned(tmp_path: Path):
    key = tmp_path / "ci.pem"
    pub = generate_keypair(key)
    other_pub = generate_keypair(tmp_path / "other.pem")
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    with pytest.raises(NoMatchingEngineError, match="is not signed"):
        resolve_local(reg, "toy", verify_key=pub)
    signed = reg.add(replace(entry, signature=sign_entry(entry, key)))
    assert resolve_local(reg, "toy", verify_key=pub) == signed
    with pytest.raises(NoMatchingEngineError, match="does not verify with"):
        resolve_local(reg, "toy", verify_key=other_pub)
    sig = bytearray(signed.signature.encode())
    sig[5] = ord("A") if sig[5] != ord("A") else ord("B")
    reg.add(replace(signed, signature=sig.decode()))
    with pytest.raises(NoMatchingEngineError, match="does not verify with"):
        resolve_local(reg, "toy", verify_key=pub)
    with pytest.raises(SignatureError, match="exists"):
        generate_keypair(key)


def test_rm_then_gc_frees_only_unshared_blobs(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    keep = reg.publish(fake_engine(tmp_path / "a", model_id="keep", payload=b"keep"))
    drop = reg.publish(fake_engine(tmp_path / "b", model_id="drop", payload=b"drop"))
    reg.checkout(drop)
    assert reg.gc(grace_s=0).blobs_removed == 0
    assert [e.model_id for e in reg.remove("drop")] == ["drop"]
    report = reg.gc(grace_s=0)
    assert report.blobs_removed == 2  # drop's model.onnx and manifest; the tokenizer is shared
    assert report.bytes_freed == drop.size_bytes - len(SHARED)
    assert sorted(reg.blobs.digests()) == sorted(keep.blobs)
    assert reg.verify() == []
    with pytest.raises(RegistryError, match="no engine 'drop'"):
        reg.remove("drop")


def test_engine_dir_for_and_build_config(tmp_path: Path):
    engine = fake_engine(tmp_path / "e")
    assert engine_dir_for(str(engine), tmp_path / "reg").path == engine
    with pytest.raises(RegistryError, match="neither an engine directory nor a model"):
        engine_dir_for("toy", tmp_path / "reg")
    missing = str(tmp_path / "missing")
    assert engine_dir_for(missing, tmp_path / "reg").path == Path(missing)  # the loader's error
    with pytest.raises(RegistryError, match="--verify-key checks engines resolved"):
        engine_dir_for(str(engine), tmp_path / "reg", verify_key=tmp_path / "k.pub")
    LocalRegistry(tmp_path / "reg").publish(engine)
    resolved = engine_dir_for("toy", tmp_path / "reg")
    assert resolved.model_name == "toy" and resolved.path.parent.name == "checkouts"
    # where an engine is published does not change what it is
    assert BuildConfig.of(registry="x").hash() == BuildConfig().hash()


def engine_with_draft(root: Path, draft_payload: bytes = b"draft weights") -> Path:
    """A fake engine with a fake draft engine in ``draft/``, recorded as `llmc build --draft`
    records it (the draft's files are not in the engine's own list)."""
    fake_engine(root, payload=b"target weights")
    fake_engine(root / "draft", payload=draft_payload, quant="int4")
    raw = (root / "draft" / "manifest.json").read_bytes()
    record = {"path": "draft", "quant": "int4", "manifest_sha256": sha(raw)}
    write_manifest(replace(read_manifest(root), draft=record), root)
    return root


def test_publish_keeps_the_draft_engine_and_checks_it(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    built = engine_with_draft(tmp_path / "e")
    entry = reg.publish(built)
    draft_raw = (built / "draft" / "manifest.json").read_bytes()
    assert entry.draft_files == {
        "draft/manifest.json": sha(draft_raw),
        "draft/model.onnx": sha(b"draft weights"),
        "draft/tokenizer/tokenizer.json": sha(SHARED),
    }
    checkout = reg.checkout(reg.find(entry.model_id)[0])
    assert (checkout / "draft" / "model.onnx").read_bytes() == b"draft weights"
    assert (checkout / "draft" / "manifest.json").read_bytes() == draft_raw
    draft = read_manifest(checkout / "draft")  # the checks the loader runs on the draft
    verify_engine_files(draft.files, checkout / "draft", "rebuild")
    assert reg.verify() == []
    # a draft file replaced in the checkout (its blob intact) is found, with the file named
    (checkout / "draft" / "model.onnx").unlink()
    (checkout / "draft" / "model.onnx").write_bytes(b"tampered")
    problems = reg.verify()
    assert len(problems) == 1 and "model.onnx" in problems[0].message


def test_publish_refuses_a_draft_that_is_not_the_recorded_one(tmp_path: Path):
    built = engine_with_draft(tmp_path / "e")
    fake_engine(tmp_path / "other", payload=b"another draft")
    (built / "draft" / "manifest.json").write_bytes(
        (tmp_path / "other" / "manifest.json").read_bytes()
    )
    reg = LocalRegistry(tmp_path / "reg")
    with pytest.raises(EngineCorruptError, match="records"):
        reg.publish(built)
    assert reg.entries() == []


def test_an_entry_whose_draft_was_swapped_is_refused(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(engine_with_draft(tmp_path / "e"))
    swapped = replace(entry, draft_files={**entry.draft_files, "draft/manifest.json": "d" * 64})
    with pytest.raises(EngineCorruptError, match="draft manifest"):
        check_entry_agrees(swapped, reg.manifest_bytes(entry), "the entry")
    plain = reg.publish(fake_engine(tmp_path / "plain", model_id="other"))
    grafted = replace(plain, draft_files=entry.draft_files)  # a draft its manifest never had
    with pytest.raises(EngineCorruptError, match="draft manifest"):
        check_entry_agrees(grafted, reg.manifest_bytes(plain), "the entry")
    # an entry published before entries kept their drafts still agrees with its manifest
    check_entry_agrees(replace(entry, draft_files={}), reg.manifest_bytes(entry), "the entry")
