"""``python -m fastps.scheduler``: starts the scheduler from FASTPS_* variables. The code lives in
``fastps.control.scheduler``; this name stays for the documented command and for old imports
(the same module object)."""

import sys

from fastps.control import scheduler as _target

if __name__ == "__main__":
    _target.main()
else:
    sys.modules[__name__] = _target
