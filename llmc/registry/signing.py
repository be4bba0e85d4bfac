"""Ed25519 signatures of engine manifests: key-based, checked offline.

A manifest lists the sha256 of every engine file, so a signature over the manifest's bytes covers
the whole engine: a host holding only the public key can refuse any engine a CI job with the
private key did not publish. Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public), as
``openssl genpkey -algorithm ed25519`` writes them; ``generate_keypair`` writes a pair. Uses the
``cryptography`` package (RFC 8032 Ed25519).
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from llmc.errors import SignatureError


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


def sign_manifest(manifest_bytes: bytes, private_key_path: str | Path) -> str:
    """Sign a manifest's exact bytes; returns the 64-byte Ed25519 signature in base64.

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
    return base64.b64encode(key.sign(manifest_bytes)).decode("ascii")


def verify_manifest(
    manifest_bytes: bytes, signature: str | None, public_key_path: str | Path, what: str
) -> None:
    """Check that ``signature`` (base64) signs ``manifest_bytes`` under the public key.

    Raises:
        SignatureError: the engine ``what`` is unsigned, the signature is malformed or does not
            verify, or the key file is not an Ed25519 public key.
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
    if signature is None:
        raise SignatureError(
            f"{what} is not signed, and --verify-key asks for a signed engine; push it with "
            "`llmc registry push --sign-key KEY`"
        )
    try:
        key.verify(base64.b64decode(signature, validate=True), manifest_bytes)
    except (InvalidSignature, binascii.Error, ValueError) as error:
        raise SignatureError(
            f"{what}: the manifest's signature does not verify with {public_key_path}; the "
            "manifest was altered or signed with another key. Refusing it"
        ) from error
