"""Compressed deltas for local SGD / DiLoCo in torch (docs/guide/local-sgd.md, "Composition"):
the digits task on 2 workers with ``DiLoCo(H=4)`` and ``compression=`` given to the
``DistributedOptimizer`` (fp16) still trains, near uncompressed DiLoCo's accuracy, while rank
0's sockets send about half the bytes (shared memory off); every replica ends with the same
parameters. (onebit with error feedback runs too, ``train onebit``, but did not train.)
The ``compression=`` knob's plumbing and refusals.

This file is also the training worker: ``python test_local_sgd_compressed.py train CODEC
EPOCHS`` (CODEC: none, fp16, onebit), run by ``fastpsrun -np 2``.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Dict, Tuple

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 30
H = 4


def train(codec: str, epochs: int) -> int:
    import fastps
    import fastps.torch as hvd
    import torch
    import torch.nn.functional as F
    from fastps.torch.algorithms.local_sgd import DiLoCo
    from fastps.worker import api

    sys.path.insert(0, str(REPO / "examples" / "torch"))
    from train_digits import build_model, load_data

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(42)
    x_train, y_train, x_test, y_test = load_data()
    model = build_model("mlp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3 * size)
    compression = {
        "none": None,
        "fp16": fastps.Compression.fp16,
        "onebit": fastps.Compression.onebit(error_feedback=True),
    }[codec]
    algorithm = DiLoCo(H=H)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        algorithm=algorithm,
        compression=compression,
    )
    sent0 = api.data_path_stats()["socket_bytes_sent"]
    batch = 16
    for epoch in range(epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        for step in range(len(order) // size // batch):
            idx = shard[step * batch : (step + 1) * batch]
            optimizer.zero_grad()
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
    if algorithm.local_steps:
        algorithm.outer_step()
    sent = api.data_path_stats()["socket_bytes_sent"] - sent0
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
        xs, ys = x_test[rank::size], y_test[rank::size]
        correct = (model(xs).argmax(dim=1) == ys).sum()
        counts = torch.stack([correct, torch.tensor(len(ys))]).to(torch.int64)
    counts = hvd.allreduce(counts, name="test.counts", op=hvd.Sum)
    print(f"RANK {rank} BYTES {sent} DIGEST {digest}", flush=True)
    if rank == 0:
        print(f"ACCURACY {float(counts[0]) / float(counts[1]):.4f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ != "__main__":
    import pytest
    from torchjobs import fastpsrun

    _runs: Dict[str, Tuple[float, int]] = {}

    def run(env: Dict[str, str], codec: str) -> Tuple[float, int]:
        """(test accuracy, bytes rank 0 sent while training), once per codec. Uncompressed
        DiLoCo(H=4) is test_local_sgd.py's run of it (the same training, step for step: it
        ended with the same parameters' digest and the same bytes as ``train none`` here,
        2026-11-30), made once for both files."""
        if codec == "none":
            import test_local_sgd

            assert test_local_sgd.EPOCHS == EPOCHS, "the two files' runs must stay the same"
            return test_local_sgd.run(env, "diloco", H)
        if codec in _runs:
            return _runs[codec]
        run_env = dict(env, FASTPS_SHM="0", FASTPS_OP_TIMEOUT="60")
        res = fastpsrun(Path(__file__), "train", codec, str(EPOCHS), np=2, env=run_env, timeout=300)
        assert res.returncode == 0, res.stdout[-4000:]
        acc = re.search(r"ACCURACY ([0-9.]+)", res.stdout)
        ranks = re.findall(r"RANK (\d) BYTES (\d+) DIGEST (\w+)", res.stdout)
        assert acc and len(ranks) == 2, res.stdout[-4000:]
        assert len({d for _r, _b, d in ranks}) == 1, f"replicas differ: {ranks}"
        sent = int(next(b for r, b, _d in ranks if r == "0"))
        print(f"DiLoCo(H={H}) {codec}: accuracy {acc.group(1)}, rank 0 sent {sent} bytes")
        _runs[codec] = (float(acc.group(1)), sent)
        return _runs[codec]

    @pytest.mark.slow
    def test_digits_converges_with_fp16_deltas(subprocess_env: Dict[str, str]) -> None:
        # Measured 2026-11-30: uncompressed 0.9711, fp16 0.9444 at 1.97x fewer bytes (one run
        # each; the gap is not explained). onebit:ef deltas under DiLoCo ended at 0.2022:
        # not trained, so not asserted here (docs/guide/local-sgd.md, "Composition").
        base_acc, base_bytes = run(subprocess_env, "none")
        acc, sent = run(subprocess_env, "fp16")
        assert acc >= 0.93 and acc >= base_acc - 0.04, (base_acc, acc)
        assert base_bytes / sent >= 1.8, (base_bytes, sent)

    def test_compression_knob_reaches_the_algorithm() -> None:
        import fastps
        import fastps.torch as hvd
        import torch
        from fastps.torch.algorithms.local_sgd import DiLoCo, LocalSGD
        from fastps.torch.algorithms.runner import resolve

        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
        algo = LocalSGD(H=2)
        onebit = fastps.Compression.onebit(error_feedback=True)
        assert resolve(algo, onebit, opt) == (None, algo)
        assert algo.compression is onebit
        # Horovod's torch spelling of fp16 means the core's.
        assert DiLoCo(H=4, compression=hvd.Compression.fp16).compression == fastps.Compression.fp16
        with pytest.raises(ValueError, match="name two compressors"):
            resolve(DiLoCo(H=4, compression=fastps.Compression.fp16), onebit, opt)
        with pytest.raises(ValueError, match="DiLoCo: compression must be one of the core's"):
            DiLoCo(H=4, compression=object())


if __name__ == "__main__" and sys.argv[1:2] == ["train"]:
    sys.exit(train(sys.argv[2], int(sys.argv[3])))
