"""Maps ``import horovod`` to fastps, so Horovod's own test files run against fastps.

Only for ``run_horovod_tests.sh``: this folder goes on PYTHONPATH for that run and nowhere
else. Nothing of Horovod lives here; each module re-exports fastps.
"""
