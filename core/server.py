"""``python -m fastps.server``: starts a summation server from FASTPS_* variables. The code lives
in ``fastps.control.server``; this name stays for the documented command and for old imports
(the same module object)."""

import sys

from fastps.control import server as _target

if __name__ == "__main__":
    _target.main()
else:
    sys.modules[__name__] = _target
