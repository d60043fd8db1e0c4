"""fastps is built by scikit-build-core from pyproject.toml; this file stays for habits and
tools that still call ``python setup.py``.

Every command is handed to pip, which runs the real (PEP 517) build in a fresh temporary
build directory:

    python setup.py install | build | bdist_wheel | develop
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

COMMANDS = {
    "install": ["install", str(ROOT)],
    "develop": ["install", "--no-build-isolation", "-e", str(ROOT)],
    "build": ["wheel", "--no-deps", "-w", str(ROOT / "dist"), str(ROOT)],
    "bdist_wheel": ["wheel", "--no-deps", "-w", str(ROOT / "dist"), str(ROOT)],
}


def main(argv: list) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        print(f"\nsupported commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "pip", *COMMANDS[argv[0]]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
