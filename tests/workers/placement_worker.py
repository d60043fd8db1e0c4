"""Checks sums on an emulated multi-machine layout and prints the weights it computed."""

from __future__ import annotations

import json

import fastps
import numpy as np
from fastps.worker import api


def main() -> None:
    fastps.init()
    rank, size = fastps.rank(), fastps.size()
    print("WEIGHTS " + json.dumps(api.server_weights()), flush=True)
    print(
        f"LOCAL {fastps.local_rank()} {fastps.local_size()} {fastps.cross_rank()} "
        f"{fastps.cross_size()}",
        flush=True,
    )
    sizes = [1, 1000, 70_000, 300_001, 1 << 20]
    for it in range(3):
        hs = []
        for j, n in enumerate(sizes):
            x = np.arange(n, dtype=np.float32) * (rank + 1) + it
            hs.append((fastps.push_pull_async(x, average=False, name=f"p{j}"), n))
        for h, n in hs:
            want = np.arange(n, dtype=np.float32) * (size * (size + 1) / 2) + it * size
            got = h.synchronize()
            assert np.allclose(got, want, rtol=1e-5), (n, got[:3], want[:3])
    print("STATS " + json.dumps(api.data_path_stats()), flush=True)
    print("PLACEMENT-OK", flush=True)
    fastps.shutdown()


if __name__ == "__main__":
    main()
