"""A signed entry cannot be rolled back: each release of a model gets the next version, signed
with the entry; a host remembers the newest version it verified (``TrustedState``, here in
tmp_path) and refuses a registry whose newest was withheld or deleted (TUF's rollback attack), and
an entry past its signed expiry (TUF's freeze attack). Engines are synthetic; S3 is moto's
in-process mock."""

from __future__ import annotations

import json
import multiprocessing
import re
from dataclasses import replace
from pathlib import Path

import pytest

from llmc.cli import main
from llmc.errors import NoMatchingEngineError, RegistryError, SignatureError
from llmc.registry.entry import IndexEntry
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import engine_dir_for, resolve_local
from llmc.registry.s3 import S3Registry
from llmc.registry.signing import generate_keypair, sign_entry, verify_entry
from llmc.registry.transfer import pull, push
from llmc.registry.trusted_state import TrustedState
from tests.registry.test_registry_local import fake_engine

BUCKET = "rollback"
REMOTE = f"s3://{BUCKET}/team"


@pytest.fixture
def s3(monkeypatch):
    """An empty mocked bucket; boto3 clients made inside reach it."""
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


def release(tmp_path: Path, reg: LocalRegistry, n: int, key: Path | None, **kw) -> IndexEntry:
    """Build engine ``n`` of model toy (its own build options, so releases coexist) and push it
    into ``reg``, signed with ``key``."""
    engine = fake_engine(
        tmp_path / f"e{n}", payload=f"w{n}".encode(), build_config_hash=f"{n}" * 64
    )
    return push(reg, str(engine), sign_key=key, **kw)


def test_withheld_newest_is_refused_naming_both_versions(tmp_path, key, capsys):
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    v1, v2 = release(tmp_path, reg, 1, key), release(tmp_path, reg, 2, key)
    assert (v1.version, v2.version) == (1, 2)
    pub = f"{key}.pub"
    assert resolve_local(reg, "toy", verify_key=pub, trusted=state) == v2
    assert state.seen(reg.identity) == {"toy": 2}

    reg.remove(v2.short_id)  # or withheld by whoever serves the registry
    message = "version 1 of toy is older than version 2 this host has seen"
    with pytest.raises(NoMatchingEngineError, match=re.escape(message)):
        resolve_local(reg, "toy", verify_key=pub, trusted=state)
    argv = ["registry", "resolve", "toy", "--registry", str(reg.root), "--verify-key", pub]
    assert main([*argv, "--trusted-state", str(state.directory)]) == 2
    err = capsys.readouterr().err
    assert message in err and "a newer entry was withheld or deleted" in err
    with pytest.raises(NoMatchingEngineError, match=re.escape(message)):
        engine_dir_for("toy", reg.root, pub, state)  # what `llmc serve` resolves
    assert state.seen(reg.identity) == {"toy": 2}  # a refusal never lowers what was seen


def test_replayed_older_entry_of_the_same_key_is_refused(tmp_path, key):
    """A rebuild with the same key replaces the entry; the old signed entry, put back, is a
    validly signed engine that the newest no longer lists."""
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    old = push(reg, str(fake_engine(tmp_path / "a", payload=b"old")), sign_key=key)
    new = push(reg, str(fake_engine(tmp_path / "b", payload=b"new")), sign_key=key)
    assert reg.entries() == [new] and new.version == old.version + 1
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state) == new
    reg.add(old)  # the attacker's saved copy replaces the newest
    with pytest.raises(NoMatchingEngineError, match="version 1 of toy is older than version 2"):
        resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)


def test_tampered_version_or_expiry_fails_the_signature(tmp_path, key):
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    signed = release(tmp_path, reg, 1, key, expires_in_days=30.0)
    verify_entry(signed, f"{key}.pub", "toy")
    for changes in [{"version": 7}, {"version": None}, {"expires": None},
                    {"expires": "2099-01-01T00:00:00+00:00"}]:  # fmt: skip
        with pytest.raises(SignatureError, match="does not verify"):
            verify_entry(replace(signed, **changes), f"{key}.pub", str(changes))
    index = json.loads((reg.root / "index.json").read_text())
    index["entries"][0]["version"] = 9  # would raise this host's floor to 9
    (reg.root / "index.json").write_text(json.dumps(index))
    with pytest.raises(NoMatchingEngineError, match="does not verify"):
        resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)
    assert state.seen(reg.identity) == {}  # only a verified version is remembered


def test_fresh_host_accepts_the_newest_it_sees(tmp_path, key):
    reg = LocalRegistry(tmp_path / "reg")
    v1, v2 = release(tmp_path, reg, 1, key), release(tmp_path, reg, 2, key)
    reg.remove(v2.short_id)
    fresh = TrustedState(tmp_path / "fresh-host")
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=fresh) == v1
    assert fresh.seen(reg.identity) == {"toy": 1}


def test_unsigned_resolution_is_not_protected_and_leaves_the_state_alone(tmp_path, key):
    """Without a verify key nothing in the registry is authenticated (anyone who can write it
    can write any version), so versions are neither checked nor remembered."""
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    v1, v2 = release(tmp_path, reg, 1, None), release(tmp_path, reg, 2, None)
    assert (v1.version, v2.version, v1.signature) == (1, 2, None)  # versioned, unsigned
    assert resolve_local(reg, "toy", trusted=state) == v2
    assert not state.directory.exists()
    signed = release(tmp_path, reg, 3, key)
    resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)
    reg.remove(signed.short_id)
    assert resolve_local(reg, "toy", trusted=state) == v2  # designed: no key, no protection
    assert state.seen(reg.identity) == {"toy": 3}


def test_unversioned_entries_resolve_until_a_versioned_one_is_seen(tmp_path, key, capsys):
    """An entry signed before versions existed: its signature still verifies; it resolves (and
    says it is unversioned) while this host has seen no versioned entry of its model."""
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    published = reg.publish(fake_engine(tmp_path / "old"))
    legacy = replace(published, version=None)
    legacy = reg.add(replace(legacy, signature=sign_entry(legacy, key)))
    pub = f"{key}.pub"
    assert resolve_local(reg, "toy", verify_key=pub, trusted=state) == legacy
    argv = ["registry", "resolve", "toy", "--registry", str(reg.root), "--verify-key", pub]
    argv += ["--trusted-state", str(state.directory)]
    assert main(argv) == 0
    assert "unversioned" in capsys.readouterr().out
    assert state.seen(reg.identity) == {}

    newer = release(tmp_path, reg, 2, key)
    assert newer.version == 2  # above the version the registry gave the legacy entry
    assert resolve_local(reg, "toy", verify_key=pub, trusted=state) == newer
    reg.remove(newer.short_id)
    with pytest.raises(
        NoMatchingEngineError, match="unversioned, and this host has seen version 2"
    ):
        resolve_local(reg, "toy", verify_key=pub, trusted=state)


def test_expired_entry_is_refused(tmp_path, key, capsys):
    """The freeze attack: a registry frozen at an old state keeps serving its newest entry of
    then; an expiry signed into the entry bounds how long."""
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    stale = release(tmp_path, reg, 1, key, expires_in_days=-1.0)
    with pytest.raises(NoMatchingEngineError, match=f"expired at {re.escape(stale.expires)}"):
        resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)
    assert resolve_local(reg, "toy") == stale  # without a key nothing is enforced
    assert state.seen(reg.identity) == {"toy": 1}  # it was released: older ones stay refused

    argv = ["registry", "push", stale.short_id, "--registry", str(reg.root)]
    assert main([*argv, "--sign-key", str(key), "--expires-in", "30"]) == 0  # re-signed
    fresh = resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)
    assert fresh.manifest_digest == stale.manifest_digest and fresh.version == 2
    assert main([*argv, "--expires-in", "30", "--remote", REMOTE]) == 2
    assert "--expires-in needs --sign-key" in capsys.readouterr().err


def test_removed_newest_then_resigned_gets_a_version_never_given_before(tmp_path, key):
    """Fix-forward: a publisher that removes a bad newest engine re-signs the one to serve; it
    gets a version above the removed one, so hosts that saw that accept it, and a replay of the
    removed engine stays below it."""
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    good, bad = release(tmp_path, reg, 1, key), release(tmp_path, reg, 2, key)
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state) == bad
    reg.remove(bad.short_id)
    resigned = push(reg, good.short_id, sign_key=key)
    assert resigned.version == 3
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state) == resigned
    reg.add(bad)  # replayed beside it: version 3 is preferred to version 2
    assert resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state) == resigned


def test_remote_withheld_newest_is_refused_by_pull(s3, tmp_path, key, capsys):
    src = LocalRegistry(tmp_path / "src")
    state = TrustedState(tmp_path / "state")
    v1 = release(tmp_path, src, 1, key, remote=REMOTE)
    v2 = release(tmp_path, src, 2, key, remote=REMOTE)
    assert (v1.version, v2.version) == (1, 2)
    pub = f"{key}.pub"
    assert pull(LocalRegistry(tmp_path / "a"), "toy", REMOTE, verify_key=pub, trusted=state) == v2
    remote = S3Registry(REMOTE)
    assert state.seen(remote.identity) == {"toy": 2}

    remote._client.delete_object(Bucket=BUCKET, Key=remote._entry_key(v2))
    clean = LocalRegistry(tmp_path / "b")
    message = "version 1 of toy is older than version 2 this host has seen"
    with pytest.raises(NoMatchingEngineError, match=re.escape(message)):
        pull(clean, "toy", REMOTE, verify_key=pub, trusted=state)
    assert not clean.root.exists()
    argv = ["registry", "pull", "toy", "--registry", str(clean.root), "--remote", REMOTE]
    assert main([*argv, "--verify-key", pub, "--trusted-state", str(state.directory)]) == 2
    assert message in capsys.readouterr().err
    fresh = TrustedState(tmp_path / "fresh-host")
    assert pull(clean, "toy", REMOTE, verify_key=pub, trusted=fresh) == v1


def test_push_versions_above_what_the_remote_holds(s3, tmp_path, key):
    """A CI runner with an empty local registry releases above the remote's newest version,
    so its engine is not mistaken for an older one."""
    for n in (1, 2):
        release(tmp_path, LocalRegistry(tmp_path / "ci-a"), n, key, remote=REMOTE)
    fresh_runner = LocalRegistry(tmp_path / "ci-b")
    third = release(tmp_path, fresh_runner, 3, key, remote=REMOTE)
    assert third.version == 3
    assert fresh_runner.get("toy") == third
    assert sorted(e.version for e in S3Registry(REMOTE).entries()) == [1, 2, 3]
    unsigned = release(tmp_path, fresh_runner, 4, None, remote=REMOTE)
    assert unsigned.version == 4 and unsigned.signature is None


def test_damaged_trusted_state_is_refused_not_forgotten(tmp_path, key):
    reg = LocalRegistry(tmp_path / "reg")
    state = TrustedState(tmp_path / "state")
    release(tmp_path, reg, 1, key)
    resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)
    state.path(reg.identity).write_text("{}")
    with pytest.raises(RegistryError, match="is damaged.*delete it to trust that registry afresh"):
        resolve_local(reg, "toy", verify_key=f"{key}.pub", trusted=state)


def _release_many(root: str, worker: int, count: int, scratch: str) -> None:
    reg = LocalRegistry(Path(root))
    for i in range(count):
        n = f"{worker}{i}"
        engine = fake_engine(Path(scratch) / n, payload=n.encode(), build_config_hash=n * 32)
        reg.publish(engine)


def test_concurrent_releases_of_one_model_never_share_a_version(tmp_path):
    workers, count = 4, 3
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_release_many, args=(tmp_path / "reg", w, count, tmp_path))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    versions = sorted(e.version for e in LocalRegistry(tmp_path / "reg").entries())
    assert versions == list(range(1, workers * count + 1))
