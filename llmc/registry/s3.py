"""A remote registry on S3-compatible object storage (AWS S3, MinIO, Ceph RGW, ...) via boto3.

Layout under ``s3://BUCKET/PREFIX/``::

    blobs/sha256/<digest>                 engine files and manifests, by sha256
    entries/<model>/<manifest digest>.json  one index entry per engine (see index.IndexEntry)

There is no shared index object to read-modify-write (S3 has no locks): each push writes its own
entry object, and the remote index is the listing of ``entries/``. A push uploads every blob
first and the entry last, and a single PUT (or a completed multipart upload) is atomic, so a
reader never sees an entry whose blobs are not all there: an interrupted push leaves only
unreferenced blobs. Every entry object is validated when listed (``IndexEntry``): a crafted one
fails the listing, naming its key and field. A pull downloads into a staging directory in the
local registry, checks every blob's sha256, the entry against its manifest (and the entry's
signature when asked), and only then moves the blobs into the store, checks the engine out and
indexes it, last: a refused pull leaves the index as it was.

Credentials and region come from the usual AWS sources (environment, ~/.aws, instance role);
the endpoint from ``endpoint_url`` or ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.entry import IndexEntry, check_entry_agrees
from llmc.registry.integrity import CHUNK_BYTES, check_digest, write_stream_atomic
from llmc.registry.local import LocalRegistry
from llmc.registry.signing import verify_entry


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: the bucket and the key prefix (no trailing slash, may be "")."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """Raises RegistryError for anything but ``s3://BUCKET[/PREFIX]``."""
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise RegistryError(f"remote {url!r} is not an s3://BUCKET[/PREFIX] URL")
        bucket, _, prefix = url[5:].partition("/")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


class S3Registry:
    """The registry at ``url`` (``s3://bucket/prefix``), reached through one boto3 client."""

    def __init__(self, url: str, endpoint_url: str | None = None) -> None:
        import boto3

        self.url = url.rstrip("/")
        self.location = S3Location.parse(url)
        self._client = boto3.client("s3", endpoint_url=endpoint_url)
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        #: What names this registry in a host's trusted state (trusted_state.py): one bucket
        #: name on two servers is two registries.
        self.identity = f"{self.url} at {endpoint}" if endpoint else self.url

    def entries(self) -> list[IndexEntry]:
        """Every engine pushed completely (its entry object exists), oldest first.

        Raises:
            RegistryError: the bucket cannot be listed (missing, no access, unreachable), or an
                entry object is not a valid entry (names its key and the field).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        entries = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=self.location.key("entries") + "/"
            )
            for page in pages:
                for item in page.get("Contents", []):
                    if item["Key"].endswith(".json"):
                        entries.append(self._entry(item["Key"]))
        except (BotoCoreError, ClientError) as error:
            raise RegistryError(f"cannot list the remote registry {self.url}: {error}") from error
        return sorted(entries, key=lambda e: e.created)

    def find(self, ref: str) -> list[IndexEntry]:
        return sorted(
            (e for e in self.entries() if e.matches(ref)), key=lambda e: e.created, reverse=True
        )

    def manifest_bytes(self, entry: IndexEntry) -> bytes:
        """The entry's manifest, checked against its digest (BlobCorruptError if altered) and
        against the entry (EngineCorruptError naming the field that differs)."""
        raw = self._get(self._blob_key(entry.manifest_digest))
        what = f"manifest of {entry.model_id}@{entry.short_id} at {self.url}"
        check_digest(entry.manifest_digest, hashlib.sha256(raw).hexdigest(), what)
        check_entry_agrees(entry, raw, what)
        return raw

    def push(self, local: LocalRegistry, entry: IndexEntry, signature: str | None) -> IndexEntry:
        """Upload a local entry's blobs (each re-hashed first; present ones skipped), then its
        entry object, carrying ``signature`` (or the entry's own when None).

        Raises:
            BlobCorruptError: a local blob is damaged; the entry is not made visible.
            RegistryError: an upload failed.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        entry = replace(entry, signature=signature or entry.signature)
        try:
            for digest in entry.blobs:
                local.blobs.verify(digest)
                if not self._exists(self._blob_key(digest)):
                    self._client.upload_file(
                        str(local.blobs.path(digest)), self.location.bucket, self._blob_key(digest)
                    )
            body = (json.dumps(entry.to_dict(), indent=1) + "\n").encode()
            self._client.put_object(
                Bucket=self.location.bucket, Key=self._entry_key(entry), Body=body
            )
        except (BotoCoreError, ClientError) as error:
            raise RegistryError(f"push to {self.url} failed: {error}") from error
        return entry

    def pull(
        self, local: LocalRegistry, entry: IndexEntry, verify_key: str | Path | None = None
    ) -> IndexEntry:
        """Download an entry into ``local``, all-or-nothing (see the module docstring).

        Raises:
            BlobCorruptError: a blob (or the manifest) differs from its digest; names the digest.
            SignatureError: ``verify_key`` is given and the entry's signature does not verify.
            EngineCorruptError: the entry and its manifest disagree (names the field).
            RegistryError: a download failed, or the checkout would leave the local root.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        what = f"{entry.model_id}@{entry.short_id} at {self.url}"
        if verify_key is not None:
            verify_entry(entry, verify_key, what)
        raw = self.manifest_bytes(entry)
        local.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=local.root))
        try:
            staged = {entry.manifest_digest: staging / "manifest"}
            write_stream_atomic([raw], staged[entry.manifest_digest])
            for digest in entry.blobs[1:]:
                if local.blobs.has(digest):
                    continue
                body = self._client.get_object(
                    Bucket=self.location.bucket, Key=self._blob_key(digest)
                )["Body"]
                staged[digest] = staging / digest
                write_stream_atomic(
                    body.iter_chunks(CHUNK_BYTES),
                    staged[digest],
                    expected=digest,
                    what=f"{self.url}/{self._blob_key(digest)}",
                )
            for digest, path in staged.items():
                local.blobs.adopt(path, digest)
            local.checkout(entry)  # an engine refused here is never indexed
            return local.add(entry)
        except (BotoCoreError, ClientError) as error:
            raise RegistryError(f"pull of {what} failed: {error}") from error
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _blob_key(self, digest: str) -> str:
        return self.location.key("blobs", "sha256", digest)

    def _entry_key(self, entry: IndexEntry) -> str:
        return self.location.key("entries", entry.model_id, f"{entry.manifest_digest}.json")

    def _entry(self, key: str) -> IndexEntry:
        try:
            data = json.loads(self._get(key))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RegistryError(f"{self.url}/{key} is not JSON ({error}); remove it") from error
        return IndexEntry.from_dict(data, f"{self.url}/{key}")

    def _get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._client.get_object(Bucket=self.location.bucket, Key=key)["Body"].read()
        except ClientError as error:
            raise RegistryError(f"cannot read {self.url}/{key}: {error}") from error

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True
