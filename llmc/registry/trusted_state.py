"""What this host has seen of each registry: the newest signed version of every model it verified.

This is the client's trusted metadata in TUF's terms: kept on the resolving host, outside every
registry it guards (whoever can rewrite a registry must not be able to rewrite what a host
remembers of it), read before resolving and raised only with versions whose signatures
verified (see rollback.py). One small JSON file per registry, named by the sha256 of its identity
(a local root's real path, or an ``s3://`` URL and its endpoint)::

    {"format": 1, "registry": "s3://engines/team", "versions": {"gemma-3-270m": 5}}

The command line keeps it under ``$XDG_STATE_HOME/llmc/trusted`` (default
``~/.local/state/llmc/trusted``, ``--trusted-state DIR``); the Python API takes a
``TrustedState`` and keeps none without one. Deleting a file makes this host trust that
registry afresh, as a new host would.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from llmc.errors import RegistryError
from llmc.registry.entry import MAX_VERSION
from llmc.registry.integrity import write_stream_atomic

STATE_FORMAT = 1
LOCK_TIMEOUT_S = 60.0


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/llmc/trusted``, else ``~/.local/state/llmc/trusted`` (the XDG base
    directory specification's place for state that outlives a process)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "llmc" / "trusted"


@dataclass(frozen=True)
class TrustedState:
    """This host's trusted state, one file per registry under ``directory``."""

    directory: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))

    def path(self, registry: str) -> Path:
        """The file that holds what this host has seen of ``registry`` (its ``identity``)."""
        return self.directory / f"{hashlib.sha256(registry.encode()).hexdigest()[:32]}.json"

    def seen(self, registry: str) -> dict[str, int]:
        """The newest verified version of each model of ``registry`` this host has seen ({} for
        a registry it never verified an entry of).

        Raises:
            RegistryError: the file is not this format. A damaged file is never read as empty:
                that would forget every version seen, the rollback it exists to refuse.
        """
        path = self.path(registry)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _damaged(path, registry, str(error)) from error
        versions = data.get("versions") if isinstance(data, dict) else None
        if not isinstance(versions, dict) or data.get("format") != STATE_FORMAT:
            raise _damaged(path, registry, f"not a trusted-state file of format {STATE_FORMAT}")
        for model, version in versions.items():
            if type(version) is not int or not 1 <= version <= MAX_VERSION:
                raise _damaged(path, registry, f"the version of {model!r} is {version!r}")
        return versions

    def raise_to(self, registry: str, newest: dict[str, int]) -> None:
        """Remember ``newest`` (model id -> a version whose signature verified) where it is above
        what was seen; never lowers a version. Read-modify-write under a file lock, so two
        resolutions at once both land.

        Raises:
            RegistryError: the file is damaged (see ``seen``), or its lock stayed taken for
                LOCK_TIMEOUT_S seconds.
        """
        from filelock import FileLock, Timeout

        path = self.path(registry)
        if all(self.seen(registry).get(m, 0) >= v for m, v in newest.items()):
            return  # the common case: nothing new, nothing written
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(path.with_suffix(".lock"), timeout=LOCK_TIMEOUT_S):
                versions = self.seen(registry)
                for model, version in newest.items():
                    versions[model] = max(versions.get(model, 0), version)
                data = {"format": STATE_FORMAT, "registry": registry, "versions": versions}
                text = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()
                write_stream_atomic([text], path, mode=0o644)
        except Timeout as error:
            raise RegistryError(
                f"{path.with_suffix('.lock')} stayed locked for {LOCK_TIMEOUT_S:g} s; another "
                "llmc process is recording what it verified, retry when it is done"
            ) from error


def _damaged(path: Path, registry: str, why: str) -> RegistryError:
    return RegistryError(
        f"{path}, this host's record of the newest engine versions it verified in {registry}, "
        f"is damaged ({why}); refusing to resolve rather than forget them. Restore it, or delete "
        "it to trust that registry afresh as a new host would"
    )
