"""The engine registry (DESIGN §1, §6): where built engines are published and resolved from.

``local`` (content-addressed blobs + an index under ``engines/``), ``entry`` (one engine's
validated index entry), ``paths`` (writes and deletes stay under the root), ``resolve`` (the
engine of a model that fits this host), ``rollback`` (signed release versions and expiry against
rollback and freeze attacks), ``trusted_state`` (the newest versions a host verified), ``s3`` (a
remote on S3-compatible storage), ``signing`` (Ed25519 entry signatures), ``transfer`` (push,
pull), ``cli`` (``llmc registry ...``).
"""
