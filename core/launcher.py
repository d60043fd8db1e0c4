"""``python -m fastps.launcher``: the same command line as fastpsrun. The code lives in
``fastps.launch.cli``; this name stays for the documented command and for old imports (the same
module object)."""

import sys

from fastps.launch import cli as _target

if __name__ == "__main__":
    _target.main()
else:
    sys.modules[__name__] = _target
