"""Prints the README's quick-start commands, one per line, so CI runs exactly what users read.

The quick start is the section headed "Quick start"; its commands are the indented
(four-space) code lines. Exactly two are expected: set up and run the main job; set up and
run the whole test suite.
"""

import sys
from pathlib import Path


def quickstart_commands(readme: str) -> list:
    commands, inside = [], False
    for line in readme.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip().lower() == "quick start"
            continue
        if inside and line.startswith("    ") and line.strip():
            commands.append(line.strip())
    return commands


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    cmds = quickstart_commands(path.read_text())
    if len(cmds) != 2:
        sys.exit(f"{path}: expected 2 quick-start commands, found {len(cmds)}: {cmds}")
    print("\n".join(cmds))
