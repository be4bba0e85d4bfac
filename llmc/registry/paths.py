"""Paths the registry writes and deletes stay under its root.

Every name under the root comes from validated entry fields or digests (see ``entry.py``), so the
only way out is a symlink: a ``checkouts/`` or ``blobs/sha256/ab/`` directory, or a checkout,
pointing elsewhere. ``confined`` resolves a path (symlinks followed) and refuses it when its real
location leaves the root; ``remove_tree`` deletes only after that check, and removes a symlink
itself rather than what it points to.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llmc.errors import RegistryError


def confined(path: Path, root: Path) -> Path:
    """``path``, after checking that its real location (symlinks resolved, present or not) is
    under the real location of ``root``.

    Raises:
        RegistryError: it resolves outside the root; names both and the fix.
    """
    real_root = root.resolve()
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop
        raise RegistryError(f"{path} does not resolve ({error}); remove that symlink") from error
    if not real.is_relative_to(real_root):
        raise RegistryError(
            f"{path} resolves to {real}, outside the registry root {real_root} (a symlink "
            "points out of it); refusing to write or delete there. Remove that symlink"
        )
    return path


def remove_tree(path: Path, root: Path) -> bool:
    """Delete the file, directory tree or symlink ``path`` under ``root``; returns whether
    something was there. A symlink is unlinked (what it points to is left alone) once its
    target is checked to be under the root too; ``shutil.rmtree`` never follows the symlinks
    inside a tree.

    Raises:
        RegistryError: ``path``, its parent or a symlink's target resolves outside the root.
    """
    confined(path.parent, root)
    if path.is_symlink():
        confined(path, root)
        path.unlink()
        return True
    if not path.exists():
        return False
    confined(path, root)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    return True
