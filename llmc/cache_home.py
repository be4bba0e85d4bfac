"""Where llmc keeps what it derives from code alone: compiled kernels, the ISA probe, exported
graph structures. ``$XDG_CACHE_HOME/llmc``, else ``~/.cache/llmc`` (the XDG base directory rule);
data derived from a user's checkpoint or text (calibration statistics) goes to ``--cache-dir``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """``$XDG_CACHE_HOME/llmc`` when the variable is set and not empty, else ``~/.cache/llmc``.
    Not created here: each writer creates its part."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmc"
