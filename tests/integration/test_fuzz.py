"""Fuzzing of the wire format and the control protocol (tests/fuzz/).

The default suite runs a bounded number of cases (a few seconds); set FASTPS_FUZZ_CASES
(e.g. 100000) for the long release run. FASTPS_FUZZ_SEED fixes the seed (default: random,
printed so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
import sys

import pytest

# The fuzzers live in tests/fuzz (also run alone, at length: docs/design/hardening.md).
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "fuzz"))

import control_fuzz  # noqa: E402
import wire_fuzz  # noqa: E402

CASES = int(os.environ.get("FASTPS_FUZZ_CASES", "400"))
SEED = int(os.environ.get("FASTPS_FUZZ_SEED", str(random.randrange(1 << 30))))


@pytest.mark.timeout(max(120, CASES // 20))
def test_wire_fuzz_server_survives_and_sums_correctly(subprocess_env):
    print(f"wire fuzz seed {SEED}")
    stats = wire_fuzz.fuzz(CASES, SEED, env=subprocess_env)
    print(stats)
    assert stats["cases"] == CASES
    assert stats["sum_checks"] >= 1
    assert stats["closed_by_server"] > 0  # the malformed frames were refused


@pytest.mark.timeout(max(120, CASES // 20))
def test_control_fuzz_scheduler_survives_and_serves_a_job():
    print(f"control fuzz seed {SEED}")
    stats = control_fuzz.fuzz(CASES, SEED)
    print(stats)
    assert stats["cases"] == CASES
