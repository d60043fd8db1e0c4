"""``python -m fastps.shared_server``: starts a server shared by several jobs. The code lives in
``fastps.control.shared_server``; this name stays for the documented command and for old imports
(the same module object)."""

import sys

from fastps.control import shared_server as _target

if __name__ == "__main__":
    sys.exit(_target.main())
else:
    sys.modules[__name__] = _target
