"""The server's API key: where it comes from, and how a request proves it holds it.

The key comes from ``--api-key``, else ``--api-key-file`` (as llama.cpp's server takes it), else
the ``LLMC_API_KEY`` environment variable (as vLLM takes ``VLLM_API_KEY``); the file and the
variable keep the key out of the process list, where a command-line flag shows. A request
proves it with exactly one ``Authorization: Bearer <key>`` header.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

from llmc.errors import EngineConfigError

API_KEY_ENV = "LLMC_API_KEY"


def resolve_api_key(
    api_key: str | None, api_key_file: str | Path | None, environ: Mapping[str, str]
) -> str | None:
    """The key the server requires, or None for no key.

    Args:
        api_key: ``--api-key``.
        api_key_file: ``--api-key-file``: a file holding the key on its one non-empty line
            (surrounding whitespace and the newline are not part of the key).
        environ: the environment; ``LLMC_API_KEY`` is used when neither option is given (set
            but empty counts as unset, as in a shell's ``LLMC_API_KEY=``).

    Raises:
        EngineConfigError: both options given; an empty ``api_key``; a key file that cannot be
            read, is empty, or holds more than one line.
    """
    if api_key is not None and api_key_file is not None:
        raise EngineConfigError("give --api-key or --api-key-file, not both")
    if api_key is not None:
        if not api_key.strip():
            raise EngineConfigError("--api-key is empty: an empty key would let anyone in")
        return api_key
    if api_key_file is not None:
        return _read_key_file(Path(api_key_file))
    return environ.get(API_KEY_ENV) or None


def _read_key_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineConfigError(f"cannot read the API key file {path}: {exc}") from exc
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise EngineConfigError(
            f"the API key file {path} must hold one key on one line; it has {len(lines)} "
            "non-empty lines"
        )
    return lines[0]


def authorized(values: list[bytes], api_key: str) -> bool:
    """Whether the request's ``Authorization`` header values prove ``api_key``: exactly one
    header, ``Bearer <api_key>`` (scheme case-insensitive), compared in constant time. Two
    headers are refused even when one is right: proxies and servers disagree on which one
    counts."""
    if len(values) != 1:
        return False
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode("latin-1"), api_key.encode()
    )
