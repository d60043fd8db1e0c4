"""What every backend test worker does first: the data path the test asked for."""

from __future__ import annotations

import os


def apply_data_path() -> None:
    """With FASTPS_TEST_DISTINCT_HOSTS=1, this rank is a host of its own (no shared memory
    or local reduce between ranks: every byte goes over TCP to the servers)."""
    if os.environ.get("FASTPS_TEST_DISTINCT_HOSTS") == "1":
        os.environ["FASTPS_HOSTNAME"] = f"host{os.environ.get('RANK', '0')}"
