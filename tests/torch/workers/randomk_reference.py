"""Random-k with error feedback inside real training, step by step against a reference
(docs/guide/compression.md, "Random-k and the optimizer"). Trains the digits example's MLP
with Adam and a DistributedOptimizer compressing with ``--spec`` (random-k with error
feedback), and at every step checks the averaged gradients fastps hands the optimizer
against a reference of the algorithm (Stich et al. 2018) run here on every rank's raw
gradients (allgathered uncompressed):

    e_w = residual_w + g_w           on every worker w
    sent at the round's indices I    (the same on every worker)
    residual_w = e_w with I zeroed
    result = mean_w e_w at I, 0 elsewhere

The round's indices are drawn here as the core draws them (docs/guide/compression.md, "Seeds":
the seed mixes the part's key, i.e. the tensor id of ``grad.<name>``, with the round;
``_core.compress`` of a vector of ones with that seed shows them), so fastps's result must
be exactly zero elsewhere and equal the reference at all k. Run by
tests/torch/test_torch_compression.py (2 workers, 2 epochs); ``--epochs 30 --spec
randomk:0.01:ef`` is the benchmark's setting.

Prints ``RANDOMK REFERENCE OK`` with the largest deviation and the test accuracy."""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

import fastps
import fastps.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from fastps import _core

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch" / "train_digits.py"


def build_model() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_model("mlp")


MASK = (1 << 64) - 1


def random_at(seed: int, i: int) -> int:
    """The core's counter-based stream (compression/compressor.cc): splitmix64."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def round_indices(spec: str, name: str, n: int, rnd: int) -> torch.Tensor:
    """The indices random-k sends for tensor ``name`` (one part) in round ``rnd``."""
    seed = random_at(_core.tensor_id(name), rnd)  # part 0's key is the tensor id
    ones = np.ones(n, dtype=np.float32)
    data = _core.compress(spec.rsplit(":ef", 1)[0], ones.ctypes.data, n, seed)
    out = np.empty_like(ones)
    _core.decompress(data, n, out.ctypes.data)
    return torch.from_numpy(np.nonzero(out)[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="randomk:0.05:ef")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = build_model()
    named = list(model.named_parameters())
    params = [p for _, p in named]
    comp = fastps.Compression.from_spec(args.spec)
    frac = float(args.spec.split(":")[1])
    assert args.spec.startswith("randomk:") and args.spec.endswith(":ef"), args.spec
    for name, p in named:  # every tensor of this model is compressed, as one part
        assert comp.spec_for(name, p.numel() * 4, "float32") == args.spec, name
    opt = hvd.DistributedOptimizer(
        torch.optim.Adam(params, lr=1e-3 * size), named_parameters=named, compression=comp
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    sizes = [p.numel() for p in params]
    ks = [min(n, max(1, math.ceil(frac * n))) for n in sizes]  # docs/guide/compression.md
    residual = [[torch.zeros(n) for n in sizes] for _ in range(size)]
    covered = [torch.zeros(n, dtype=torch.bool) for n in sizes]
    worst, rounds = 0.0, 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
        shard = order[rank::size]
        for step in range(len(order) // size // 16):
            idx = shard[step * 16 : (step + 1) * 16]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            # The raw gradient first (autograd.grad runs no accumulate hooks), then the
            # ordinary backward whose hooks push the same gradient compressed.
            raw = torch.autograd.grad(loss, params, retain_graph=True)
            loss.backward()
            opt.synchronize()
            flat = torch.cat([g.reshape(-1) for g in raw]).unsqueeze(0)
            everyone = hvd.allgather(flat, name="raw.grads")  # [size, total]
            off = 0
            for i, (p, n, k) in enumerate(zip(params, sizes, ks)):
                got = p.grad.reshape(-1)
                at = round_indices(args.spec, "grad." + named[i][0], n, rounds)
                assert len(at) == k, f"{named[i][0]}: {len(at)} indices drawn, k = {k}"
                outside = got.clone()
                outside[at] = 0.0
                assert not outside.any(), f"{named[i][0]} round {rounds}: values off the indices"
                e = [residual[w][i] + everyone[w, off : off + n] for w in range(size)]
                want = sum(ew[at] for ew in e) * (1.0 / size)
                err = float(((got[at] - want).abs() / (1e-6 + want.abs())).max())
                worst = max(worst, err)
                assert err < 1e-5, f"{named[i][0]} round {rounds}: off by {err} (relative)"
                for w in range(size):
                    e[w][at] = 0.0  # sent: it leaves the residual
                    residual[w][i] = e[w]
                covered[i][at] = True
                off += n
            with opt.skip_synchronize():
                opt.step()
            rounds += 1
    coverage = [float(c.float().mean()) for c in covered]
    expect = [1 - (1 - k / n) ** rounds for n, k in zip(sizes, ks)]
    for name_p, c, ex in zip(named, coverage, expect):
        assert c >= 0.9 * ex, f"{name_p[0]}: {c:.3f} of the values ever sent, expected ~{ex:.3f}"

    model.eval()
    with torch.no_grad():
        correct = (model(x_test[rank::size]).argmax(dim=1) == y_test[rank::size]).sum()
        counts = torch.stack([correct, torch.tensor(len(y_test[rank::size]))]).to(torch.int64)
    counts = hvd.allreduce(counts, name="test.counts", op=hvd.Sum)
    acc = float(counts[0]) / float(counts[1])
    print(
        f"rank {rank} RANDOMK REFERENCE OK {args.spec}: {rounds} rounds, largest relative "
        f"deviation {worst:.2e}, test accuracy {acc:.4f}",
        flush=True,
    )
    hvd.shutdown()


if __name__ == "__main__":
    main()
