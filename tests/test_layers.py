"""Layers point down (DESIGN §2, STYLE 13): import-linter's contracts in ``pyproject.toml`` hold,
and no two files of llmc import each other, directly or through others."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    """``lint-imports``: the layers, the runtime/registry/calibration without the compiler, a
    light ``llmc.engine``, no cycles between sibling packages."""
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    command = command or shutil.which("lint-imports")
    if command is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[dev]' (import-linter)")
    result = subprocess.run(
        [command, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_no_file_level_import_cycles() -> None:
    """``python ci/import_metrics.py --cycles``: no strongly connected component of more than
    one module in grimp's import graph of llmc (function-local imports included)."""
    result = subprocess.run(
        [sys.executable, "ci/import_metrics.py", "--cycles"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
