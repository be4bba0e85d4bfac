"""A registry checkout is reused once assembled, so it is checked again where it is trusted:
``llmc registry verify`` re-checks it against its entry, and ``llmc generate``/``serve`` pass the
manifest digest they resolved to the loader, which refuses a ``manifest.json`` replaced since.
Engines are synthetic (``fake_engine``); nothing is deserialized before these checks refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import llmc.registry.resolve
from llmc.cli import main
from llmc.errors import EngineCorruptError
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import engine_dir_for
from llmc.runtime.runners.engine_loader import load_engine
from tests.registry.test_registry_local import fake_engine, sha


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` over a checkout file, a hard link to a read-only blob, as an attacker
    would: unlink it, then write a new file (the blob stays intact)."""
    path.unlink()
    path.write_bytes(data)


def poisoned_manifest(checkout: Path) -> bytes:
    """The checkout's manifest, edited (a larger max_batch) and still a valid manifest."""
    manifest = json.loads((checkout / "manifest.json").read_bytes())
    return json.dumps({**manifest, "max_batch": 64}).encode()


@pytest.mark.parametrize(
    ("poison", "message"),
    [
        ("weights", "model.onnx has sha256 {poison}, but the manifest expects {weights}; delete"),
        ("unlisted", "extra.onnx is not in the manifest"),
        ("manifest", "was altered: its manifest.json hashes to {poison}"),
    ],
)
def test_verify_reports_a_poisoned_checkout(tmp_path: Path, capsys, poison: str, message: str):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    checkout = reg.checkout(entry)
    argv = ["registry", "verify", "--registry", str(reg.root)]
    assert reg.verify() == [] and main(argv) == 0  # untouched: clean
    assert "1 engine(s) checked, 0 problem(s)" in capsys.readouterr().out

    data = poisoned_manifest(checkout) if poison == "manifest" else b"poison"
    if poison == "unlisted":
        (checkout / "extra.onnx").write_bytes(data)
    else:
        replace_file(checkout / ("manifest.json" if poison == "manifest" else "model.onnx"), data)
    [problem] = reg.verify()
    assert problem.entry.manifest_digest == entry.manifest_digest
    assert message.format(poison=sha(data), weights=sha(b"weights")) in problem.message
    assert str(checkout) in problem.message
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "1 problem(s)" in out and f"toy@{entry.short_id}" in err
    assert reg.verify("toy") == [problem]  # by reference too

    shutil.rmtree(checkout)  # the fix the message gives: assembled again from the blobs
    assert reg.verify() == [] and reg.checkout(entry) == checkout and reg.verify() == []


def test_loader_refuses_a_manifest_replaced_after_resolve(tmp_path: Path):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    resolved = engine_dir_for("toy", reg.root)
    assert resolved.manifest_sha256 == entry.manifest_digest
    assert engine_dir_for(str(tmp_path / "e"), reg.root).manifest_sha256 is None  # a path
    replace_file(resolved.path / "manifest.json", poisoned_manifest(resolved.path))
    with pytest.raises(EngineCorruptError, match="replaced after it was checked") as raised:
        load_engine(resolved.path, expected_manifest_sha256=resolved.manifest_sha256)
    assert f"sha256:{entry.manifest_digest}" in str(raised.value)


@pytest.mark.parametrize("command", [["generate", "--max-tokens", "1"], ["serve", "--port", "0"]])
def test_cli_pins_the_resolved_manifest(tmp_path: Path, monkeypatch, capsys, command: list[str]):
    """The manifest is replaced between ``engine_dir_for`` and the load: the CLI refuses it.
    Without the pin the load would go on and fail elsewhere (the fake engine has no plan)."""
    reg = LocalRegistry(tmp_path / "reg")
    reg.publish(fake_engine(tmp_path / "e"))
    resolve = llmc.registry.resolve.engine_dir_for

    def resolve_then_tamper(*args):
        resolved = resolve(*args)
        replace_file(resolved.path / "manifest.json", poisoned_manifest(resolved.path))
        return resolved

    monkeypatch.setattr(llmc.registry.resolve, "engine_dir_for", resolve_then_tamper)
    name, *options = command
    argv = [name, "toy", *(["hi"] if name == "generate" else []), *options]
    assert main([*argv, "--registry", str(reg.root)]) == 2
    assert "EngineCorruptError" in (err := capsys.readouterr().err)
    assert "replaced after it was checked" in err
