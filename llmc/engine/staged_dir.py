"""Write a directory in full or not at all: build output goes to a hidden sibling first."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``out``; when the block ends normally it
    replaces ``out`` (an older ``out`` is removed), when it raises (Ctrl-C included) it is
    deleted and ``out`` is left as it was. The rename is atomic on one file system, so readers
    never see a half-written engine or stage."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


@contextmanager
def scratch_dir(out: Path) -> Iterator[Path]:
    """Yield an empty hidden directory beside ``out`` for a build's intermediate files (the
    streamed float graph); it is removed when the block ends, however it ends. Beside ``out``
    so that it is on the disk the engine goes to, not in a small ``/tmp``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.work.", dir=out.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
