"""The registry end to end on tiny engines: two concurrent `llmc build --registry` processes, then
push to and pull from a real S3-compatible server (moto's standalone server, a child process on
127.0.0.1), greedy output of pulled engines, tampered blobs, signatures, interrupted pushes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llmc.cli import main
from llmc.errors import BlobCorruptError, EngineCorruptError, NoMatchingEngineError
from llmc.registry.local import LocalRegistry
from llmc.registry.resolve import resolve_local
from llmc.registry.s3 import S3Registry
from llmc.runtime.llm import LLM
from llmc.runtime.sampling_params import SamplingParams
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

PROMPTS = ["ROMEO:", "To be, or not to be"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BUCKET = "engines"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(work dir, registry): llama and gemma3 built by two `llmc build` processes at once, both
    publishing into one registry; their engine directories are work/out-<name>."""
    work = tmp_path_factory.mktemp("registry")
    make_tiny_llama(work / "llama", sharp=True)
    make_tiny_gemma3(work / "gemma", sharp=True)
    registry = work / "engines"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "llmc.cli", "build", str(work / name)]
            + ["--block-size", "4", "--max-seq-len", "64", "--max-num-tokens", "64"]
            + ["-o", str(work / f"out-{name}"), "--registry", str(registry)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("llama", "gemma")
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-3000:]
        assert "published: " in out
    return work, registry


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> str:
    """Endpoint URL of a moto S3 server process with bucket BUCKET; AWS credentials in env."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.2)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    server.terminate()
    server.wait(10)
    log.close()


def greedy_ids(engine_dir: Path) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM(engine_dir).generate(PROMPTS, GREEDY)]


def registry_cli(*args: str) -> int:
    return main(["registry", *args])


def flip_byte(data: bytes, at: int) -> bytes:
    changed = bytearray(data)
    changed[at] ^= 0x40
    return bytes(changed)


def test_concurrent_builds_publish_both(built):
    work, registry = built
    index = json.loads((registry / "index.json").read_text())
    assert sorted(e["model_id"] for e in index["entries"]) == ["gemma", "llama"]
    reg = LocalRegistry(registry)
    assert reg.verify() == []
    for name in ("llama", "gemma"):
        checkout = reg.checkout(resolve_local(reg, name))
        built_files = sorted(
            p.relative_to(work / f"out-{name}")
            for p in (work / f"out-{name}").rglob("*")
            if p.is_file()
        )
        assert (
            sorted(p.relative_to(checkout) for p in checkout.rglob("*") if p.is_file())
            == built_files
        )
        for rel in built_files:
            assert (checkout / rel).read_bytes() == (work / f"out-{name}" / rel).read_bytes()


def test_generate_by_model_id(built, capsys):
    work, registry = built
    argv = ["generate", "llama", *PROMPTS, "--registry", str(registry), "--json"]
    assert main([*argv, "--max-tokens", str(GREEDY.max_tokens)]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_id = [json.loads(line)["token_ids"] for line in lines]
    assert by_id == greedy_ids(work / "out-llama")
    assert all(len(ids) == GREEDY.max_tokens for ids in by_id)


def test_push_pull_clean_registry_serve_same_greedy_output(built, s3, tmp_path, capsys):
    """Push to S3, pull into an empty registry, `llmc serve MODEL` resolves the pulled engine:
    its greedy completions are the original engine's."""
    work, registry = built
    remote = f"s3://{BUCKET}/team"
    assert registry_cli("push", "llama", "--registry", str(registry), "--remote", remote,
                        "--endpoint-url", s3) == 0  # fmt: skip
    clean = tmp_path / "clean"
    assert registry_cli("pull", "llama", "--registry", str(clean), "--remote", remote,
                        "--endpoint-url", s3) == 0  # fmt: skip
    engine = Path(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("engine: "))
    assert engine.parent == clean / "checkouts"
    assert LocalRegistry(clean).verify() == []

    original = LLM(work / "out-llama").generate(PROMPTS, GREEDY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "llmc.cli", "serve", "llama", "--registry", str(clean)]
        + ["--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not _is_up(url):
            assert server.poll() is None, server.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "llmc serve did not come up"
            time.sleep(0.3)
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["llama"]
        for prompt, want in zip(PROMPTS, original, strict=True):
            body = {"model": "llama", "prompt": prompt, "max_tokens": GREEDY.max_tokens}
            body |= {"temperature": 0.0, "ignore_eos": True}
            got = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
            assert got["choices"][0]["text"] == want.outputs[0].text
            assert got["usage"]["completion_tokens"] == GREEDY.max_tokens
    finally:
        server.terminate()
        server.wait(30)


def _is_up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_tampered_remote_blob_refused_nothing_left(built, s3, tmp_path):
    _, registry = built
    local = LocalRegistry(registry)
    entry = local.get("gemma")
    remote = S3Registry(f"s3://{BUCKET}/tamper", endpoint_url=s3)
    remote.push(local, entry, None)
    digest = max(entry.files.values(), key=lambda d: local.blobs.path(d).stat().st_size)
    key = f"tamper/blobs/sha256/{digest}"
    body = remote._client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    remote._client.put_object(Bucket=BUCKET, Key=key, Body=flip_byte(body, len(body) // 2))

    clean = LocalRegistry(tmp_path / "clean")
    with pytest.raises(BlobCorruptError, match=f"blob sha256:{digest}"):
        remote.pull(clean, entry)
    assert clean.entries() == []
    assert list(clean.blobs.digests()) == []
    assert [p.name for p in clean.root.iterdir()] == []  # no staging dir, no partial file

    # and a local blob flipped after a good pull: the engine is refused on load
    good = LocalRegistry(tmp_path / "good")
    S3Registry(f"s3://{BUCKET}/tamper2", endpoint_url=s3).push(local, entry, None)
    S3Registry(f"s3://{BUCKET}/tamper2", endpoint_url=s3).pull(good, entry)
    checkout = good.checkout(entry)
    blob = good.blobs.path(digest)
    os.chmod(blob, 0o644)
    blob.write_bytes(flip_byte(blob.read_bytes(), 7))
    with pytest.raises(EngineCorruptError, match=f"manifest expects {digest}"):
        LLM(checkout)
    assert f"sha256:{digest}" in good.verify()[0].message


def test_signed_push_verified_pull(built, s3, tmp_path, capsys):
    _, registry = built
    key, other = tmp_path / "ci.pem", tmp_path / "other.pem"
    assert registry_cli("keygen", str(key)) == 0 and registry_cli("keygen", str(other)) == 0
    remote = f"s3://{BUCKET}/signed"
    common = ["--remote", remote, "--endpoint-url", s3]
    assert registry_cli("push", "llama", "--registry", str(registry), "--sign-key", str(key),
                        *common) == 0  # fmt: skip
    assert "(signed)" in capsys.readouterr().out

    def pull(into: str, pub: Path) -> int:
        return registry_cli("pull", "llama", "--registry", str(tmp_path / into),
                            "--verify-key", str(pub), *common)  # fmt: skip

    assert registry_cli("ls", "--json", *common) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["model_id"] == "llama" and listed["signature"]
    assert pull("ok", Path(f"{key}.pub")) == 0
    assert LocalRegistry(tmp_path / "ok").get("llama").signature is not None
    assert pull("wrong", Path(f"{other}.pub")) == 2
    assert "does not verify with" in capsys.readouterr().err
    assert not (tmp_path / "wrong" / "index.json").exists()

    client = S3Registry(remote, endpoint_url=s3)._client
    (item,) = client.list_objects_v2(Bucket=BUCKET, Prefix="signed/entries/")["Contents"]
    doc = json.loads(client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read())
    doc["signature"] = (
        doc["signature"][:10]
        + ("A" if doc["signature"][10] != "A" else "B")
        + doc["signature"][11:]
    )
    client.put_object(Bucket=BUCKET, Key=item["Key"], Body=json.dumps(doc).encode())
    assert pull("tampered", Path(f"{key}.pub")) == 2
    assert "does not verify with" in capsys.readouterr().err


def test_interrupted_push_is_invisible(built, s3, tmp_path):
    work, _ = built
    local = LocalRegistry(tmp_path / "local")
    entry = local.publish(work / "out-gemma")
    last = entry.blobs[-1]
    os.chmod(local.blobs.path(last), 0o644)
    local.blobs.path(last).write_bytes(b"damaged")
    remote = S3Registry(f"s3://{BUCKET}/partial", endpoint_url=s3)
    with pytest.raises(BlobCorruptError, match=last):
        remote.push(local, entry, None)
    listed = remote._client.list_objects_v2(Bucket=BUCKET, Prefix="partial/")["Contents"]
    assert len(listed) == len(entry.blobs) - 1  # every blob before the damaged one went up
    assert remote.entries() == []
    with pytest.raises(NoMatchingEngineError, match="no engine of 'gemma'"):
        from llmc.registry.transfer import pull

        pull(LocalRegistry(tmp_path / "clean"), "gemma", remote.url, s3)
