"""The piece of ``horovod.runner`` Horovod's test helpers import (``util.threads``)."""
