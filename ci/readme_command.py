"""Print one of the README's two set-up commands, so CI runs exactly what a newcomer reads.

    python ci/readme_command.py main    # build the default model's engine and generate with it
    python ci/readme_command.py tests   # install with the test extras and run the test suite

The commands are the indented lines starting with ``pip install`` in the README's section
"Set up on a fresh machine": the first is the main job, the second the tests. Exit code 1 when
the section does not hold exactly two.
"""

import sys
from pathlib import Path

SECTION = "## Set up on a fresh machine"


def setup_commands(readme: str) -> list[str]:
    """The indented ``pip install ...`` lines of the set-up section, in order."""
    body = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [ln.strip() for ln in body.splitlines() if ln.startswith("    pip install ")]


def main() -> int:
    """Print the command named by argv[1]; exit 1 on a bad argument or README."""
    commands = setup_commands((Path(__file__).parents[1] / "README.md").read_text())
    if len(commands) != 2 or sys.argv[1:] not in (["main"], ["tests"]):
        print(f"usage: readme_command.py main|tests; the README holds {commands}", file=sys.stderr)
        return 1
    print(commands[0] if sys.argv[1] == "main" else commands[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
