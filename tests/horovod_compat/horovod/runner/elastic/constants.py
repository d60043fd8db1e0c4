"""``horovod.runner.elastic.constants``: the message a job stopped by ``--reset-limit``
fails with (``launch._run_elastic`` raises it when fastpsrun stops for that reason)."""

RESET_LIMIT_EXCEEDED_MESSAGE = "fastpsrun stopped the elastic job: resets exceeded --reset-limit {}"
