"""``horovod.runner.common.util.config_parser``: horovodrun's flags → environment.

Of horovodrun's tuning flags only the log level has a fastps counterpart here; the elastic
tests set no others. fastps reads its own settings from FASTPS_* (docs/reference/configuration.md).
"""

from typing import Any, Dict


def set_env_from_args(env: Dict[str, str], args: Any) -> Dict[str, str]:
    level = getattr(args, "log_level", None)
    if level:
        env["HOROVOD_LOG_LEVEL"] = str(level)
    return env
