"""Ed25519 signatures of registry entries: key-based, checked offline.

A signature covers every field of an entry that resolution, filters or paths read (model id,
target, ISA, dtype, quant, created_at, ...) and its manifest's digest; the manifest lists the
sha256 of every engine file, so the signature covers the whole engine: a host holding only the
public key can refuse any engine, or any edit of its entry, a CI job with the private key did not
publish. Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public), as
``openssl genpkey -algorithm ed25519`` writes them; ``generate_keypair`` writes a pair. Uses the
``cryptography`` package (RFC 8032 Ed25519).
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from llmc.errors import SignatureError
from llmc.registry.entry import IndexEntry


def generate_keypair(private_path: str | Path) -> Path:
    """Write a new Ed25519 private key to ``private_path`` (mode 0600) and its public key to
    ``<private_path>.pub``; returns the public key's path. Refuses to overwrite a key.

    Raises:
        SignatureError: ``private_path`` or its ``.pub`` already exists.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + ".pub")
    for path in (private_path, public_path):
        if path.exists():
            raise SignatureError(f"{path} exists; choose another path or remove it first")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(public_pem)
    return public_path


def sign_entry(entry: IndexEntry, private_key_path: str | Path) -> str:
    """Sign an entry's ``signed_payload()``; returns the 64-byte Ed25519 signature in base64.

    Raises:
        SignatureError: the key file is unreadable or not an Ed25519 private key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(private_key_path).read_bytes(), None)
    except (OSError, ValueError, TypeError) as error:
        raise SignatureError(
            f"cannot read the signing key {private_key_path} ({error}); give an unencrypted "
            "Ed25519 private key in PEM (`llmc registry keygen KEY` writes one)"
        ) from error
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{private_key_path} is not an Ed25519 private key")
    return base64.b64encode(key.sign(entry.signed_payload())).decode("ascii")


def verify_entry(entry: IndexEntry, public_key_path: str | Path, what: str) -> None:
    """Check that ``entry.signature`` signs ``entry.signed_payload()`` under the public key:
    every field of the entry but its size (see ``IndexEntry.signed_payload``).

    Raises:
        SignatureError: the engine ``what`` is unsigned, the signature is malformed or does not
            verify (a field was edited, another key signed it, or an llmc before signature
            scheme v2 signed only its manifest), or the key file is not an Ed25519 public key.
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(Path(public_key_path).read_bytes())
    except (OSError, ValueError, TypeError) as error:
        raise SignatureError(
            f"cannot read the verification key {public_key_path} ({error}); give an Ed25519 "
            "public key in PEM"
        ) from error
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"{public_key_path} is not an Ed25519 public key")
    if entry.signature is None:
        raise SignatureError(
            f"{what} is not signed, and --verify-key asks for a signed engine; push it with "
            "`llmc registry push --sign-key KEY`"
        )
    try:
        key.verify(base64.b64decode(entry.signature, validate=True), entry.signed_payload())
    except (InvalidSignature, binascii.Error, ValueError) as error:
        raise SignatureError(
            f"{what}: the entry's signature does not verify with {public_key_path}; a field "
            "of the entry (model, target, dtype, quant, created_at, manifest digest...) was "
            "altered, another key signed it, or an older llmc signed only its manifest. "
            "Refusing it; re-sign the engine from a good copy with `llmc registry push REF "
            "--sign-key KEY [--remote ...]`"
        ) from error
