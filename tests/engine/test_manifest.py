"""The engine manifest: round trip, host checks before loading, digests of engine files."""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from llmc.engine import manifest as mf
from llmc.engine.host import check_host
from llmc.engine.isa import HostIsa
from llmc.engine.manifest import (
    FORMAT_VERSION,
    EngineManifest,
    file_digests,
    read_manifest,
    verify_files,
    write_manifest,
)
from llmc.errors import EngineCorruptError, EngineMismatchError, EngineNotFoundError

HOST = HostIsa("x86_64", ("avx2", "avx512", "avx512-vnni"), "executed")
ORT = {"onnxruntime": "1.31.1"}
MODEL_BYTES = bytes(range(256)) * 8


def make_manifest(files: dict[str, str] | None = None) -> EngineManifest:
    return EngineManifest(
        model_id="gemma-3-270m",
        source="gemma-3-270m",
        checkpoint_digest="a" * 64,
        tokenizer_digest="b" * 64,
        target="cpu",
        isa=["avx2", "avx512"],
        arch="x86_64",
        dtype="float32",
        quant="none",
        kv_cache_dtype="float32",
        max_seq_len=2048,
        max_num_tokens=512,
        max_batch=16,
        block_size=16,
        num_layers=2,
        num_kv_heads=1,
        head_dim=64,
        vocab_size=1000,
        plugin_versions={"llmc::PagedAttention": "1"},
        backend="onnxruntime",
        backend_version="1.31.0",
        execution_provider="CPUExecutionProvider",
        build_config={"arch": "cpu", "max_seq_len": 2048},
        build_config_hash="c" * 64,
        pass_report={"fuse_rms_norm": 5},
        files=files or {},
    )


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "model.onnx").write_bytes(MODEL_BYTES)
    (tmp_path / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    write_manifest(make_manifest(file_digests(tmp_path)), tmp_path)
    return tmp_path


def mismatch(m: EngineManifest, host: HostIsa = HOST, backends: dict = ORT) -> str:
    with pytest.raises(EngineMismatchError) as raised:
        check_host(m, host, backends)
    return str(raised.value)


def test_round_trip_and_digests(engine: Path):
    m = read_manifest(engine)
    assert replace(make_manifest(m.files), created_at=m.created_at) == m
    assert m.format_version == FORMAT_VERSION
    assert m.files == {
        "model.onnx": hashlib.sha256(MODEL_BYTES).hexdigest(),
        "tokenizer/tokenizer.json": hashlib.sha256(b'{"model": {}}').hexdigest(),
    }
    verify_files(m, engine)
    check_host(m, HOST, ORT)  # same major.minor (1.31.0 vs 1.31.1): accepted


def test_atomic_write_leaves_no_temp_file(engine: Path, monkeypatch):
    assert sorted(p.name for p in engine.iterdir()) == ["manifest.json", "model.onnx", "tokenizer"]
    before = (engine / "manifest.json").read_text()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(mf.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_manifest(replace(make_manifest(), max_batch=99), engine)
    assert sorted(p.name for p in engine.iterdir()) == ["manifest.json", "model.onnx", "tokenizer"]
    assert (engine / "manifest.json").read_text() == before


def test_gpu_engine_is_not_a_cpu_engine():
    message = mismatch(replace(make_manifest(), target="sm90"))
    assert "engine built for sm90 is not a cpu engine" in message
    assert (
        "rebuild it for this host (cpu-avx512-vnni) with `llmc build gemma-3-270m --arch cpu`"
        in message
    )


def test_other_machine_arch():
    message = mismatch(replace(make_manifest(), arch="aarch64", isa=["neon"]))
    assert "engine built for aarch64, this host is x86_64" in message
    assert "rebuild on this host with `llmc build gemma-3-270m --arch cpu`" in message


def test_missing_isa_features_are_named():
    m = replace(make_manifest(), isa=["avx2", "avx512", "avx512-bf16", "amx"], dtype="bfloat16")
    message = mismatch(m, host=HostIsa("x86_64", ("avx2",), "executed"))
    assert "engine built for cpu-avx512-bf16-amx needs avx512, avx512-bf16, amx" in message
    assert "this host (cpu-avx2) does not run" in message
    assert "`llmc build gemma-3-270m --arch cpu --dtype bfloat16`" in message


def test_backend_major_minor_must_match():
    message = mismatch(replace(make_manifest(), backend_version="1.30.2"))
    assert "built with onnxruntime 1.30.2 but 1.31.1 is installed" in message
    assert "install onnxruntime 1.30.x or rebuild" in message
    assert "not installed; install onnxruntime 1.31.x" in mismatch(make_manifest(), backends={})


def test_unknown_format_version():
    assert "upgrade llmc" in mismatch(replace(make_manifest(), format_version=FORMAT_VERSION + 1))
    assert "rebuild the engine" in mismatch(replace(make_manifest(), format_version=0))


def test_missing_engine_or_manifest(tmp_path: Path):
    with pytest.raises(EngineNotFoundError, match="does not exist"):
        read_manifest(tmp_path / "nowhere")
    with pytest.raises(EngineNotFoundError, match="has no manifest.json"):
        read_manifest(tmp_path)


def test_corrupt_manifest(engine: Path):
    path = engine / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(path.read_text()[:-20])
    with pytest.raises(EngineCorruptError, match="manifest.json is corrupt: not valid JSON"):
        read_manifest(engine)
    path.write_text(json.dumps({**data, "max_seq_len": "2048"}))
    with pytest.raises(EngineCorruptError, match="'max_seq_len' should be int, got '2048'"):
        read_manifest(engine)
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "head_dim"}))
    with pytest.raises(EngineCorruptError, match="'head_dim' is missing"):
        read_manifest(engine)
    path.write_text(json.dumps({**data, "format_version": 2}))
    with pytest.raises(EngineMismatchError, match="engine format 2 is newer"):
        read_manifest(engine)


def test_flipped_byte_is_caught_with_both_digests(engine: Path):
    m = read_manifest(engine)
    flipped = bytearray(MODEL_BYTES)
    flipped[100] ^= 0x01
    (engine / "model.onnx").write_bytes(flipped)
    with pytest.raises(EngineCorruptError) as raised:
        verify_files(m, engine)
    message = str(raised.value)
    assert "model.onnx" in message
    assert f"expects {hashlib.sha256(MODEL_BYTES).hexdigest()}" in message
    assert f"has sha256 {hashlib.sha256(flipped).hexdigest()}" in message
    assert "rebuild it with `llmc build gemma-3-270m --arch cpu` or re-pull it" in message
    (engine / "model.onnx").unlink()
    with pytest.raises(EngineCorruptError, match="model.onnx .* is missing"):
        verify_files(m, engine)
