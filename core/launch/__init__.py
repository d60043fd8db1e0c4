"""Starting jobs: ``fastpsrun`` and what it needs.

``cli`` is the command line; ``job`` the launcher of a job on this machine (the base every
launcher extends), ``cluster`` and ``cluster_cli`` jobs over several machines (``hosts``,
``remote`` over ssh with ``remote_agent`` on the far side, ``slurm``), ``elastic_driver``,
``elastic_cli`` and ``discovery`` elastic jobs, and ``progress`` the live status line.
"""
