"""``horovod.torch`` is ``fastps.torch``."""

import sys

import fastps.torch as _impl

sys.modules[__name__] = _impl
