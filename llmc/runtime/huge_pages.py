"""Transparent huge pages (2 MiB) for the weights, through glibc's ``malloc`` tunable.

Why: decode reads every weight once per step. On 4 KiB pages, streaming Gemma 3 270M's 671 MB
vocabulary projection touches 164k pages and misses the TLB on each; on 2 MiB pages it touches
336. Measured on the 2-core AMD EPYC (Zen 3) of DESIGN §9's sessions, ONNX Runtime's float32
``MatMul`` of the [640, 262144] projection, same process layout, one run each way: 29-37 ms ->
22 ms at M=1, 50-55 ms -> 46-51 ms at M=16.

How: ONNX Runtime allocates (and prepacks) weights with ``malloc``. Where the kernel's THP mode is
``madvise`` (the common server default, and these machines'), only memory marked with
``madvise(MADV_HUGEPAGE)`` gets huge pages. glibc >= 2.35 marks its own mappings when the process
starts with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc manual, "Memory Allocation
Tunables"). Tunables are read once at process start, so the ``llmc`` command (and the benchmark)
re-execute themselves with it set; a Python process that embeds ``LLM`` sets it before starting.
numpy already marks its own large arrays (the KV cache).

``LLMC_HUGE_PAGES=0`` turns the re-execution off.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # the first release with glibc.malloc.hugetlb


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The kernel's THP mode, the bracketed word of ``path`` ("always", "madvise", "never");
    None where the file is missing or unreadable (not Linux, THP not built)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library this process runs on; None if it is not glibc."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    major, _, minor = version.partition(".")
    try:
        return int(major), int(minor.split(".")[0])
    except ValueError:
        return None


def huge_pages_env(
    environ: Mapping[str, str],
    mode: str | None = None,
    glibc: tuple[int, int] | None = None,
) -> dict[str, str] | None:
    """``environ`` plus the hugetlb tunable, or None when re-executing would change nothing.

    None when: ``LLMC_HUGE_PAGES=0``; the tunable is already set; THP is not in ``madvise``
    mode (``always`` gives huge pages anyway, ``never`` or no THP cannot); glibc is older than
    2.35 or absent. ``mode`` and ``glibc`` default to this host's. Other tunables are kept.
    """
    mode = thp_mode() if mode is None else mode
    glibc = glibc_version() if glibc is None else glibc
    current = environ.get("GLIBC_TUNABLES", "")
    if environ.get("LLMC_HUGE_PAGES") == "0" or "glibc.malloc.hugetlb=" in current:
        return None
    if mode != "madvise" or glibc is None or glibc < MIN_GLIBC:
        return None
    return {**environ, "GLIBC_TUNABLES": f"{current}:{TUNABLE}" if current else TUNABLE}


def reexec_with_huge_pages(command: Sequence[str]) -> None:
    """Replace this process with ``command`` (an argv, ``command[0]`` an executable path) run
    with the hugetlb tunable, when :func:`huge_pages_env` says it helps; else return.

    Call it first thing, before any work: the process is replaced (same PID, same open files).
    Raises OSError if the exec fails.
    """
    env = huge_pages_env(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], list(command), env)
