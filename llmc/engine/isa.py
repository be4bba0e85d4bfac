"""Host CPU ISA detection by what runs, not by cpuid flags (DESIGN §6, §9).

A CPU, or the hypervisor in front of it, may advertise an instruction set that faults when used.
So each feature is tested by executing one of its instructions: a tiny C program (the probe,
source below) is compiled once with gcc into ``~/.cache/llmc/``, keyed by the hash of its source
and flags, and run once per feature in a child process. A feature is present iff its probe exits
0; SIGILL, a refused permission or a wrong result means absent. The cpuid flags in
``/proc/cpuinfo`` only pick which features are worth probing. Without gcc, the result falls back
to the cpuid flags minus AMX (the one feature that needs more than a flag: a permission request
to the kernel) and says so in ``HostIsa.method`` and ``HostIsa.notes``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmc.cache_home import cache_home

# Canonical feature names, as recorded in an engine manifest's `isa`.
FEATURES = ("amx", "avx2", "avx512", "avx512-bf16", "avx512-vnni", "neon")

# Probe name -> the cpuid flag (/proc/cpuinfo "flags", or "Features" on aarch64) that must be
# listed before the probe is run.
_PROBE_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512-vnni": "avx512_vnni",
    "avx512-bf16": "avx512_bf16",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "neon": "asimd",
}
_PROBES_BY_ARCH = {
    "x86_64": tuple(p for p in _PROBE_FLAGS if p != "neon"),
    "aarch64": ("neon",),
}
# Canonical feature -> the probes that must all pass. The AVX-512 extensions count only on top of
# the F+BW+VL base, so an engine built for "avx512-vnni" may also use any base AVX-512 op.
_AVX512_BASE = ("avx512f", "avx512bw", "avx512vl")
_CANONICAL = {
    "avx2": ("avx2",),
    "avx512": _AVX512_BASE,
    "avx512-vnni": (*_AVX512_BASE, "avx512-vnni"),
    "avx512-bf16": (*_AVX512_BASE, "avx512-bf16"),
    "amx": ("amx-tile", "amx-int8", "amx-bf16"),
    "neon": ("neon",),
}
_COMPILE_FLAGS = ("-O1", "-std=gnu11")  # no -march: only the probed instruction needs a feature
_PROBE_EXIT_REASONS = {2: "the kernel refused the AMX permission request", 4: "wrong result"}
_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HostIsa:
    """The instruction sets this host executes.

    Attributes:
        arch: ``"x86_64"`` or ``"aarch64"`` (other machines keep ``platform.machine()``).
        features: sorted canonical names from ``FEATURES`` (``"avx512"`` = F, BW and VL all run).
        method: ``"executed"`` (each feature's probe ran) or ``"cpuid-fallback"`` (no probe could
            be built; cpuid flags minus AMX).
        notes: why advertised features were left out, or why the fallback was used.
    """

    arch: str
    features: tuple[str, ...]
    method: str
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        """Short label for messages, e.g. ``"cpu-avx512-vnni-bf16"`` or ``"cpu-avx2"``."""
        return isa_name(self.features)


def isa_name(features: Iterable[str]) -> str:
    """Label a feature set: ``cpu-`` + widest vector ISA + its extensions (+ ``-amx``)."""
    present = set(features)
    if "avx512" in present:
        parts = ["avx512"]
        parts += [ext for ext in ("vnni", "bf16") if f"avx512-{ext}" in present]
    elif "avx2" in present:
        parts = ["avx2"]
    elif "neon" in present:
        parts = ["neon"]
    else:
        parts = ["generic"]
    if "amx" in present:
        parts.append("amx")
    return "cpu-" + "-".join(parts)


def missing_features(required: Sequence[str], host: HostIsa) -> list[str]:
    """The features of ``required`` the host lacks, in their given order, without duplicates."""
    return [f for f in dict.fromkeys(required) if f not in host.features]


@functools.cache
def detect_host_isa() -> HostIsa:
    """Detect the host's ISA features by executing a probe for each advertised one.

    Takes ~10-50 ms once the probe is compiled (one child process per advertised feature); the
    first call on a machine also compiles the probe (~0.1 s). Never raises: without a working
    gcc it returns the cpuid fallback, with the reason in ``notes``.
    """
    arch = _machine()
    flags = _cpu_flags()
    candidates = [p for p in _PROBES_BY_ARCH.get(arch, ()) if _PROBE_FLAGS[p] in flags]
    if not candidates:
        return _assemble(arch, {}, "executed", ())
    try:
        binary = _probe_binary()
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        verdicts = {p: None if not p.startswith("amx") else "not probed" for p in candidates}
        note = f"features read from cpuid flags, not executed ({error}); AMX left out"
        return _assemble(arch, verdicts, "cpuid-fallback", (note,))
    verdicts = {p: run_probe([str(binary), p]) for p in candidates}
    notes = tuple(f"{p}: advertised by cpuid but {why}" for p, why in verdicts.items() if why)
    return _assemble(arch, verdicts, "executed", notes)


def run_probe(command: Sequence[str]) -> str | None:
    """Run one probe command; return None if it exited 0, else why it failed (e.g. "SIGILL")."""
    try:
        result = subprocess.run(command, capture_output=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"its probe timed out after {_TIMEOUT_S:g} s"
    except OSError as error:
        return f"its probe could not start ({error})"
    code = result.returncode
    if code == 0:
        return None
    if code < 0:
        try:
            return f"its probe died with {signal.Signals(-code).name}"
        except ValueError:
            return f"its probe died with signal {-code}"
    return f"its probe exited {code} ({_PROBE_EXIT_REASONS.get(code, 'failed')})"


def _assemble(
    arch: str, verdicts: dict[str, str | None], method: str, notes: tuple[str, ...]
) -> HostIsa:
    """Build a HostIsa from per-probe verdicts (None = ran; a missing probe counts as failed)."""
    ran = {p for p, why in verdicts.items() if why is None}
    features = tuple(sorted(f for f, probes in _CANONICAL.items() if ran.issuperset(probes)))
    return HostIsa(arch=arch, features=features, method=method, notes=notes)


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's cpuid flags ("flags" on x86, "Features" on arm); empty if none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _probe_binary() -> Path:
    """Compile the probe into the cache dir once (keyed by source and flags); return its path.

    Raises:
        RuntimeError: no C compiler (``$CC`` or gcc) was found, or compiling failed.
        OSError: the cache directory cannot be written.
    """
    compiler = os.environ.get("CC") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("gcc not found")
    key = hashlib.sha256("\0".join((PROBE_SOURCE, *_COMPILE_FLAGS)).encode()).hexdigest()[:16]
    cache_dir = cache_home()
    target = cache_dir / f"isa-probe-{key}"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Why a temporary name and a rename: a concurrent detection never runs a half-written file.
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    source = partial.with_suffix(".c")
    source.write_text(PROBE_SOURCE)
    try:
        command = [compiler, *_COMPILE_FLAGS, "-o", str(partial), str(source)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            first_error = (result.stderr.strip().splitlines() or ["no output"])[0]
            raise RuntimeError(f"compiling the ISA probe with {compiler} failed: {first_error}")
        os.replace(partial, target)
    finally:
        source.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return target


# The probe: `probe FEATURE` executes one instruction of FEATURE and exits 0 if it ran (for AMX,
# if it also computed the right result). Exit 2 = the kernel refused the AMX permission, 3 =
# unknown feature, 4 = wrong result; death by SIGILL = the CPU or VM lacks the feature. gas
# assembles every mnemonic whatever the -m flags, so the rest of the program needs no feature.
PROBE_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>

#define ZMM3(insn) __asm__ volatile(insn " %%zmm0, %%zmm1, %%zmm2" ::: "xmm0", "xmm1", "xmm2")

/* Linux >= 5.16 keeps AMX tile data off until the process asks (ARCH_REQ_XCOMP_PERM for
   XFEATURE_XTILEDATA); a tile instruction before that dies with SIGILL even where AMX works. */
static int amx_permit(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

/* tmm0 = C [16 x 16 x 4 B], tmm1 = A [16 x 64 B], tmm2 = B [16 x 64 B] (palette 1). */
static void amx_config(void) {
    static uint8_t cfg[64] __attribute__((aligned(64)));
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (int t = 0; t < 3; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

static void amx_load(const void *a, const void *b) {
    __asm__ volatile("tilezero %%tmm0\n\ttileloadd (%0,%2,1), %%tmm1\n\ttileloadd (%1,%2,1), %%tmm2"
                     : : "r"(a), "r"(b), "r"((long)64) : "memory");
}

static void amx_store(void *c) {
    __asm__ volatile("tilestored %%tmm0, (%0,%1,1)\n\ttilerelease" : : "r"(c), "r"((long)64)
                     : "memory");
}

static int amx(const char *f) {
    static uint8_t a[16 * 64], b[16 * 64];
    static union { int32_t i[256]; float f[256]; } c;
    if (!amx_permit()) return 2;
    amx_config();
    if (!strcmp(f, "amx-int8")) {
        memset(a, 1, sizeof a), memset(b, 2, sizeof b);  /* int8: 64 products of 1 * 2 */
        amx_load(a, b);
        __asm__ volatile("tdpbssd %%tmm2, %%tmm1, %%tmm0" ::: "memory");
        amx_store(c.i);
        for (int i = 0; i < 256; i++) if (c.i[i] != 128) return 4;
    } else if (!strcmp(f, "amx-bf16")) {
        for (int i = 0; i < 16 * 32; i++) {  /* bf16 1.0 = 0x3f80, 2.0 = 0x4000: 32 products */
            ((uint16_t *)a)[i] = 0x3f80, ((uint16_t *)b)[i] = 0x4000;
        }
        amx_load(a, b);
        __asm__ volatile("tdpbf16ps %%tmm2, %%tmm1, %%tmm0" ::: "memory");
        amx_store(c.f);
        for (int i = 0; i < 256; i++) if (c.f[i] != 64.0f) return 4;
    } else if (!strcmp(f, "amx-tile")) {
        amx_load(a, b);
        amx_store(c.i);
        for (int i = 0; i < 256; i++) if (c.i[i] != 0) return 4;
    } else {
        return 3;
    }
    return 0;
}
#endif

int main(int argc, char **argv) {
    if (argc != 2) return 3;
    const char *f = argv[1];
#if defined(__x86_64__)
    if (!strcmp(f, "avx2")) {
        __asm__ volatile("vpaddd %%ymm0, %%ymm1, %%ymm2" ::: "xmm0", "xmm1", "xmm2");
        return 0;
    }
    if (!strcmp(f, "avx512f")) { ZMM3("vpaddd"); return 0; }
    if (!strcmp(f, "avx512bw")) { ZMM3("vpaddb"); return 0; }
    if (!strcmp(f, "avx512vl")) {  /* vpabsq exists only in EVEX; on a ymm it needs VL */
        __asm__ volatile("vpabsq %%ymm1, %%ymm2" ::: "xmm1", "xmm2");
        return 0;
    }
    if (!strcmp(f, "avx512-vnni")) { ZMM3("vpdpbusd"); return 0; }
    if (!strcmp(f, "avx512-bf16")) { ZMM3("vdpbf16ps"); return 0; }
    if (!strncmp(f, "amx-", 4)) return amx(f);
#elif defined(__aarch64__)
    if (!strcmp(f, "neon")) {
        __asm__ volatile("add v0.4s, v1.4s, v2.4s" ::: "v0", "v1", "v2");
        return 0;
    }
#endif
    return 3;
}
"""
