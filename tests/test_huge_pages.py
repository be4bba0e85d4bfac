"""Huge pages through glibc's malloc tunable: when the environment gets it, and that a process
re-executed with it really gets 2 MiB pages for a large malloc."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmc.runtime.huge_pages import TUNABLE, huge_pages_env, thp_mode


def test_env_adds_tunable_and_keeps_others():
    env = huge_pages_env(
        {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", (2, 36)
    )
    assert env["A"] == "1"
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"
    assert huge_pages_env({}, "madvise", (2, 35))["GLIBC_TUNABLES"] == TUNABLE


@pytest.mark.parametrize(
    ("environ", "mode", "glibc"),
    [
        ({"GLIBC_TUNABLES": TUNABLE}, "madvise", (2, 36)),  # set already: no exec loop
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", (2, 36)),  # the user's choice
        ({"LLMC_HUGE_PAGES": "0"}, "madvise", (2, 36)),
        ({}, "always", (2, 36)),
        ({}, "never", (2, 36)),
        ({}, None, (2, 36)),
        ({}, "madvise", (2, 34)),
    ],
)
def test_env_unchanged_when_it_cannot_help(environ, mode, glibc):
    # mode None means "no THP file": pass a mode the function cannot mistake for the host's.
    assert huge_pages_env(environ, mode or "absent", glibc) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(f) == "madvise"
    assert thp_mode(tmp_path / "missing") is None


# A child that re-executes itself through reexec_with_huge_pages, then mallocs and touches 64 MiB
# (ctypes malloc: numpy marks its own arrays) and prints its tunables and AnonHugePages in kB.
CHILD = """
import ctypes, os, sys
from llmc.runtime.huge_pages import reexec_with_huge_pages
reexec_with_huge_pages([sys.executable, *sys.argv])
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
n = 64 << 20
p = libc.malloc(n)
ctypes.memset(p, 1, n)
rollup = open("/proc/self/smaps_rollup").read()
huge = next(int(l.split()[1]) for l in rollup.splitlines() if l.startswith("AnonHugePages:"))
print(os.environ.get("GLIBC_TUNABLES"), huge)
"""


@pytest.mark.skipif(
    huge_pages_env({}) is None, reason="THP is not in madvise mode here, or glibc < 2.35"
)
def test_reexec_gives_huge_pages(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in __import__("os").environ.items() if k != "GLIBC_TUNABLES"}
    on = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    off = subprocess.run(
        [sys.executable, str(script)], env={**env, "LLMC_HUGE_PAGES": "0"}, capture_output=True,
        text=True,
    )  # fmt: skip
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    tunables, huge = on.stdout.split()
    assert tunables == TUNABLE
    assert int(huge) >= 32 << 10  # at least half of the 64 MiB in 2 MiB pages
    tunables, huge = off.stdout.split()
    assert tunables == "None" and int(huge) < 32 << 10
