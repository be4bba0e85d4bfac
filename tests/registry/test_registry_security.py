"""Registry entries are untrusted input: a crafted field never becomes a path,
a signature covers every field of an entry, a refused pull leaves the index as it was, and rm/gc
never delete outside the registry root. S3 is moto's in-process mock; engines are synthetic."""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from llmc.cli import main
from llmc.errors import NoMatchingEngineError, RegistryError, SignatureError
from llmc.registry.entry import IndexEntry
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import resolve_local
from llmc.registry.s3 import S3Registry
from llmc.registry.signing import generate_keypair, sign_entry, verify_entry
from llmc.registry.transfer import pull, push
from tests.registry.test_registry_local import fake_engine

BUCKET = "sec"
REMOTE = f"s3://{BUCKET}/team"


@pytest.fixture
def s3(monkeypatch):
    """An empty mocked bucket; yields nothing (boto3 clients made inside reach it)."""
    import boto3
    from moto import mock_aws

    for name, value in [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A private key; its public key is ``<key>.pub``."""
    generate_keypair(tmp_path / "ci.pem")
    return tmp_path / "ci.pem"


def push_toy(tmp_path: Path, key: Path | None) -> IndexEntry:
    """Publish a synthetic engine in ``tmp_path/src`` and push it to REMOTE, signed with key."""
    return push(LocalRegistry(tmp_path / "src"), str(fake_engine(tmp_path / "e")), REMOTE,
                sign_key=key)  # fmt: skip


def edit_remote(entry: IndexEntry, **changes) -> None:
    """Overwrite the entry object of ``entry`` at REMOTE with ``changes`` applied."""
    remote = S3Registry(REMOTE)
    doc = {**entry.to_dict(), **changes}
    body = json.dumps(doc).encode()
    remote._client.put_object(Bucket=BUCKET, Key=remote._entry_key(entry), Body=body)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for directories and links)."""
    return {
        str(p): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in root.rglob("*")
    }


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "verify-key"])
def test_dotdot_target_refused_before_any_filesystem_write(s3, tmp_path, key, capsys, signed):
    """The old checkout path was checkouts/<model>-<target>-...: this target put it in tmp_path
    (with a valid --verify-key: the old signature covered only the manifest)."""
    entry = push_toy(tmp_path, key)
    edit_remote(entry, target="/../../../escaped")
    before = tree(tmp_path)
    argv = ["registry", "pull", "toy", "--registry", str(tmp_path / "clean"), "--remote", REMOTE]
    argv += ["--verify-key", f"{key}.pub"] if signed else []
    assert main(argv) == 2
    assert "field 'target' is '/../../../escaped'" in capsys.readouterr().err
    assert tree(tmp_path) == before  # not even the clean registry's root was made


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("created_at", "2099-01-01T00:00:00+00:00"),  # would win the newest-first choice
        ("target", "sm90"),
        ("quant", "int4"),
        ("dtype", "bfloat16"),
        ("isa", ["avx2"]),
    ],
)
def test_signed_entry_edited_fails_verification_and_is_not_indexed(
    s3, tmp_path, key, capsys, name, value
):
    clean = LocalRegistry(tmp_path / "clean")
    clean.publish(fake_engine(tmp_path / "keep", model_id="keep"))
    entry = push_toy(tmp_path, key)
    edit_remote(entry, **{name: value})
    index = (clean.root / "index.json").read_bytes()
    edited = replace(entry, **{name: value})
    with pytest.raises(SignatureError, match="signature does not verify"):
        verify_entry(edited, f"{key}.pub", "edited")
    with pytest.raises(SignatureError, match="signature does not verify"):
        S3Registry(REMOTE).pull(clean, edited, f"{key}.pub")
    argv = ["registry", "pull", "toy", "--registry", str(clean.root), "--remote", REMOTE]
    assert main([*argv, "--verify-key", f"{key}.pub"]) == 2
    assert f"the entry's {name} is {value!r} but its manifest's is" in capsys.readouterr().err
    assert main(argv) == 2  # without a key too: the entry disagrees with its manifest
    assert (clean.root / "index.json").read_bytes() == index
    assert not (clean.root / "checkouts" / entry.manifest_digest).exists()


def test_signature_covers_every_field_but_the_recomputed_size(tmp_path, key):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    signed = replace(entry, signature=sign_entry(entry, key))
    verify_entry(signed, f"{key}.pub", "toy")
    other = {str: "other", list: ["avx2"], dict: {"x.bin": "e" * 64}, type(None): "1.0", int: 7}
    for f in fields(IndexEntry):
        if f.name in ("signature", "size_bytes"):
            continue
        value = getattr(entry, f.name)
        changed = other[type(value)]
        if f.name.endswith(("digest", "hash")):
            changed = "f" * 64
        elif f.name in ("created_at", "expires"):
            changed = "2030-01-01T00:00:00+00:00"
        elif f.name == "draft_files":
            changed = {"draft/manifest.json": "e" * 64}
        elif f.name == "lora_files":
            changed = {"lora/a/adapter_config.json": "e" * 64}
        with pytest.raises(SignatureError, match="does not verify"):
            verify_entry(replace(signed, **{f.name: changed}), f"{key}.pub", f.name)
    assert reg.add(replace(signed, size_bytes=1)).size_bytes == entry.size_bytes

    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), None)
    old = base64.b64encode(private.sign(reg.manifest_bytes(entry))).decode()  # llmc <= v1
    with pytest.raises(SignatureError, match="an older llmc signed only its manifest.*re-sign"):
        verify_entry(replace(entry, signature=old), f"{key}.pub", "toy")


@pytest.mark.parametrize(
    "changes",
    [
        {"target": "../../x"},
        {"target": "a\x00b"},
        {"quant": ".."},
        {"dtype": ""},
        {"isa": ["../x"]},
        {"created_at": "yesterday"},
    ],
    ids=["dotdot", "nul", "dots", "empty", "isa", "created_at"],
)
def test_refused_pull_leaves_index_unchanged(s3, tmp_path, changes):
    clean = LocalRegistry(tmp_path / "clean")
    clean.publish(fake_engine(tmp_path / "keep", model_id="keep"))
    before = tree(clean.root)
    edit_remote(push_toy(tmp_path, None), **changes)
    with pytest.raises(RegistryError, match=f"field '{next(iter(changes))}'"):
        pull(clean, "toy", REMOTE)
    assert tree(clean.root) == before


def test_publish_refuses_invalid_model_id_before_writing(tmp_path):
    with pytest.raises(RegistryError, match="field 'model_id' is 'x..y/../..'"):
        LocalRegistry(tmp_path / "reg").publish(fake_engine(tmp_path / "e", model_id="x..y/../.."))
    assert not (tmp_path / "reg").exists()


def test_rm_with_crafted_index_entry_deletes_nothing_outside(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    (reg.root / "checkouts" / "toy-").mkdir(parents=True)  # left by an earlier checkout
    sentinel = tmp_path / f"sentinel-float32-none-{entry.short_id}"  # the old checkout path
    (sentinel / "keep.txt").parent.mkdir()
    (sentinel / "keep.txt").write_text("keep")
    index = json.loads((reg.root / "index.json").read_text())
    index["entries"][0]["target"] = "/../../../sentinel"
    (reg.root / "index.json").write_text(json.dumps(index))
    with pytest.raises(RegistryError, match="field 'target'.*delete that entry from"):
        reg.remove("toy")
    with pytest.raises(RegistryError, match="field 'target'"):
        reg.gc(grace_s=0)
    assert (sentinel / "keep.txt").read_text() == "keep"


def test_rm_gc_checkout_refuse_symlinks_out_of_the_root(tmp_path):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    outside = tmp_path / "outside"
    old_name = f"toy-cpu-float32-none-{entry.short_id}"
    for name in (entry.manifest_digest, old_name, "stale"):  # where a checkout path could land
        (outside / name).mkdir(parents=True)
        (outside / name / "keep.txt").write_text("keep")
    (reg.root / "checkouts").symlink_to(outside, target_is_directory=True)
    stray = "f" * 64  # an unreferenced "blob" in a blob directory linked out of the root
    (outside / "ff").mkdir()
    (outside / "ff" / stray).write_text("keep")
    (reg.blobs.directory / "ff").symlink_to(outside / "ff", target_is_directory=True)
    before = tree(outside)

    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.checkout(entry)
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.gc(grace_s=0)
    os.unlink(reg.blobs.directory / "ff")
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.gc(grace_s=0)  # now the checkouts/ link
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.remove("toy")
    assert tree(outside) == before

    os.unlink(reg.root / "checkouts")
    entry = reg.publish(fake_engine(tmp_path / "e2", payload=b"other"))
    (reg.root / "checkouts").mkdir()
    (reg.root / "checkouts" / entry.manifest_digest).symlink_to(outside / "stale")
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.remove(entry.short_id)
    assert tree(outside) == before


def test_pull_refused_at_checkout_is_not_indexed(s3, tmp_path):
    push_toy(tmp_path, None)
    clean = LocalRegistry(tmp_path / "clean")
    clean.root.mkdir()
    (tmp_path / "outside").mkdir()
    (clean.root / "checkouts").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(RegistryError, match="outside the registry root"):
        pull(clean, "toy", REMOTE)
    assert not (clean.root / "index.json").exists()
    assert list((tmp_path / "outside").iterdir()) == []


@pytest.mark.parametrize(
    ("name", "value"), [("target", "sm90"), ("created_at", "2099-01-01T00:00:00+00:00")]
)
def test_local_index_edit_refused_by_resolve_and_verify(tmp_path, key, name, value):
    reg = LocalRegistry(tmp_path / "reg")
    entry = reg.publish(fake_engine(tmp_path / "e"))
    reg.add(replace(entry, signature=sign_entry(entry, key)))
    index = json.loads((reg.root / "index.json").read_text())
    index["entries"][0][name] = value
    (reg.root / "index.json").write_text(json.dumps(index))
    disagrees = f"the entry's {name} is {value!r} but its manifest's is"
    with pytest.raises(NoMatchingEngineError, match=re.escape(disagrees)):
        resolve_local(reg, "toy", verify_key=f"{key}.pub")
    with pytest.raises(NoMatchingEngineError, match=re.escape(disagrees)):
        resolve_local(reg, "toy")
    (problem,) = reg.verify()
    assert disagrees in problem.message


def test_lock_symlinked_out_of_the_root_is_refused(tmp_path):
    """Taking the lock opens index.lock with O_TRUNC; filelock 4 already refuses a symlink
    (ELOOP, an OSError), the registry refuses it first with its own message."""
    reg = LocalRegistry(tmp_path / "reg")
    reg.publish(fake_engine(tmp_path / "e"))
    (tmp_path / "precious.txt").write_text("keep")
    (reg.root / "index.lock").unlink()
    (reg.root / "index.lock").symlink_to(tmp_path / "precious.txt")
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.publish(fake_engine(tmp_path / "e2", payload=b"other"))
    with pytest.raises(RegistryError, match="outside the registry root"):
        reg.gc(grace_s=0)
    assert (tmp_path / "precious.txt").read_text() == "keep"


def test_newest_is_the_latest_time_not_the_greatest_string(tmp_path, key):
    """created_at strings with other UTC offsets, or fractional seconds, do not order as the
    times they name: the resolver compares times."""
    reg = LocalRegistry(tmp_path / "reg")
    times = [
        "2026-01-01T09:00:00+09:00",  # 00:00 UTC: the oldest, the greatest string
        "2026-01-01T05:00:00Z",  # 05:00 UTC
        "2026-01-01T05:00:00.250000+00:00",  # 05:00:00.25 UTC: the newest, the least string
    ]
    assert sorted(times, reverse=True) == times
    entries = []
    for i, created_at in enumerate(times):
        engine = fake_engine(
            tmp_path / str(i), created_at=created_at, build_config_hash=f"{i}" * 64
        )
        entry = reg.publish(engine)
        entries.append(reg.add(replace(entry, signature=sign_entry(entry, key))))
    assert reg.find("toy") == entries[::-1]
    assert resolve_local(reg, "toy") == entries[2]
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub") == entries[2]
