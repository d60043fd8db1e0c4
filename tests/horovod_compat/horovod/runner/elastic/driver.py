"""``horovod.runner.elastic.driver``: the two settings Horovod's tests patch. ``launch.
_run_elastic`` reads them when it starts fastpsrun: the discovery period becomes
FASTPS_ELASTIC_DISCOVERY_INTERVAL, the elastic timeout ``--elastic-timeout``."""

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
ELASTIC_TIMEOUT_SECS = 600
