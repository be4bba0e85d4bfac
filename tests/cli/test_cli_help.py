"""``llmc --help`` and every subcommand's ``--help`` with only the base dependencies importable.

A fresh ``pip install -e .`` has none of the optional extras (``[dev]``, ``[registry]``,
``[gemma]``, ``[openvino]``). This test runs the CLI in a subprocess whose import system refuses
every top-level module that only an extra brings, so a start-up import of one (``httpx``
through ``llmc bench``, say) fails here as it fails for a new user. CI also runs the README's
commands in fresh virtual environments (``.ci/run``); this is the fast check of the same rule.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from llmc.cli import build_parser, command_paths

ROOT = Path(__file__).resolve().parents[2]


def _dist_name(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement (``moto[server]>=5`` -> moto)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_only_modules() -> list[str]:
    """Top-level import names that only distributions an extra requires provide (a namespace
    a base dependency shares is not one: ``opentelemetry`` holds the API FastAPI imports and the
    SDK the ``[otel]`` extra adds)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_dist_name(r) for r in project["dependencies"]}
    extras = {_dist_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    only = extras - base
    modules = [
        module
        for module, dists in packages_distributions().items()
        if all(_dist_name(d) in only for d in dists) and module.isidentifier()
    ]
    return sorted(set(modules))


_CHILD = """
import importlib.abc, json, sys
blocked = set(json.loads(sys.argv[1]))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra, not installed)")
        return None

sys.meta_path.insert(0, Block())
from llmc.cli import main
failures = []
for argv in json.loads(sys.argv[2]):
    try:
        main([*argv, "--help"])
        failures.append([argv, "returned instead of printing help"])
    except SystemExit as e:
        if e.code not in (0, None):
            failures.append([argv, f"exit {e.code}"])
    except BaseException as e:
        failures.append([argv, f"{type(e).__name__}: {e}"])
print("FAILURES" + json.dumps(failures))
"""


def test_blocked_modules_cover_the_dev_extra() -> None:
    # The blocker must refuse what only [dev] brings, or the check below proves nothing.
    blocked = extras_only_modules()
    assert {"pytest", "openai", "boto3"} <= set(blocked)
    assert "httpx" not in blocked  # a base dependency: `llmc bench` imports it


def test_every_command_help_works_with_base_dependencies_only() -> None:
    paths = command_paths(build_parser())
    names = {" ".join(p) for p in paths}
    assert {"", "build", "generate", "serve", "bench", "registry", "registry pull"} <= names
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(extras_only_modules()), json.dumps(paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FAILURES"))
    assert json.loads(line.removeprefix("FAILURES")) == []
