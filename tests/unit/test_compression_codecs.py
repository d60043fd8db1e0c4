"""Each compressor of csrc/compression alone, through fastps._core.compress/decompress,
against a reference written here in numpy; specs parsed and refused by name; bad
payloads refused instead of read past their end. The compressors through real servers:
tests/integration/test_compression.py."""

from __future__ import annotations

import numpy as np
import pytest
from fastps import _core
from fastps.errors import FastPSError
from fastps.worker.compression import Compression, spec_for

HEADER = 24


def roundtrip(spec: str, x: np.ndarray, seed: int = 0):
    x = np.ascontiguousarray(x, dtype=np.float32)
    data = _core.compress(spec, x.ctypes.data, x.size, seed)
    out = np.empty_like(x)
    _core.decompress(data, x.size, out.ctypes.data)
    return out, data


def values(n: int = 4097, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 3


def test_fp16_and_bf16_round_to_nearest() -> None:
    x = values()
    out, data = roundtrip("fp16", x)
    assert len(data) == HEADER + 2 * x.size
    np.testing.assert_array_equal(out, x.astype(np.float16).astype(np.float32))
    out, data = roundtrip("bf16", x)
    assert len(data) == HEADER + 2 * x.size
    # bfloat16 reference: round the top 16 bits to nearest even.
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    np.testing.assert_array_equal(out, rounded.astype(np.uint32).view(np.float32))


def test_onebit_is_sign_times_mean_magnitude() -> None:
    x = values()
    x[5] = 0.0
    out, data = roundtrip("onebit", x)
    assert len(data) == HEADER + 4 + (x.size + 7) // 8
    scale = np.float32(np.abs(x.astype(np.float64)).mean())
    want = np.where(np.signbit(x), -scale, scale).astype(np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize(
    "n,k,count", [(4097, "0.01", 41), (4097, "0.5", 2049), (4097, "7", 7), (100_003, "0.01", 1001)]
)
def test_topk_keeps_the_largest(n: int, k: str, count: int) -> None:
    # 100_003 values take the sampled-threshold path; ties are broken by lowest index.
    x = values(n)
    x[100:110] = x[5]  # ties
    x[n // 2] = np.nan  # NaN ranks first
    out, data = roundtrip(f"topk:{k}", x)
    assert len(data) == HEADER + 8 * count
    mag = np.where(np.isnan(x), np.inf, np.abs(x))
    keep = np.argsort(-mag, kind="stable")[:count]
    want = np.zeros_like(x)
    want[keep] = x[keep]
    np.testing.assert_array_equal(out, want)


def topk_reference(x: np.ndarray, count: int) -> np.ndarray:
    mag = np.where(np.isnan(x), np.inf, np.abs(x))
    keep = np.argsort(-mag, kind="stable")[:count]
    want = np.zeros_like(x)
    want[keep] = x[keep]
    return want


@pytest.mark.parametrize("nonzeros", [50, 655, 656, 900, 3000])
def test_topk_sparse_part_takes_its_nonzeros(nonzeros: int) -> None:
    # A server's sum of sparse pushes: the sample is mostly zeros, so the nonzeros are the
    # candidates, and with fewer than k of them the lowest-index zeros fill the rest.
    n, count = 65536, 656
    rng = np.random.default_rng(nonzeros)
    x = np.zeros(n, dtype=np.float32)
    x[rng.choice(n, nonzeros, replace=False)] = rng.standard_normal(nonzeros).astype(np.float32)
    x[:7] = -0.0
    out, data = roundtrip("topk:0.01", x)
    assert len(data) == HEADER + 8 * count
    np.testing.assert_array_equal(out, topk_reference(x, count))
    idx = np.frombuffer(data[HEADER : HEADER + 4 * count], dtype=np.uint32)
    assert (np.diff(idx.astype(np.int64)) > 0).all()  # index order, no repeats


def test_topk_unlucky_sample_falls_back_to_all_values() -> None:
    # The sampled values are the largest, so too few values pass the sample's threshold:
    # the selection runs over the whole part and is still exact.
    n, count = 65536, 656
    x = values(n, seed=3) * 1e-3
    stride = n // 2048
    x[: 60 * stride : stride] = 1000 + np.arange(60, dtype=np.float32)
    x[123] = np.inf
    x[777] = -np.inf
    x[4000] = np.nan
    out, _ = roundtrip("topk:0.01", x)
    np.testing.assert_array_equal(out, topk_reference(x, count))


@pytest.mark.parametrize("n", [1, 15, 16, 17, 8193, 70001])
def test_topk_every_length_and_whole_part(n: int) -> None:
    # Lengths around the 16-value vector step and the sampling bound; k = n sends all.
    x = values(n, seed=n)
    x[n // 3] = np.nan
    for k, count in (("0.01", int(np.ceil(0.01 * n))), (str(n), n)):
        out, _ = roundtrip(f"topk:{k}", x)
        np.testing.assert_array_equal(out, topk_reference(x, count))


def test_randomk_same_seed_same_indices() -> None:
    x = values()
    a, data = roundtrip("randomk:0.05", x, seed=11)
    b, _ = roundtrip("randomk:0.05", x * 2, seed=11)
    c, _ = roundtrip("randomk:0.05", x, seed=12)
    k = int(np.ceil(0.05 * x.size))
    assert len(data) == HEADER + 4 * k
    nz = np.nonzero(a)[0]
    assert len(nz) == k  # k distinct indices (the values are never 0 here)
    np.testing.assert_array_equal(a[nz], x[nz])
    np.testing.assert_array_equal(np.nonzero(b)[0], nz)  # indices from the seed alone
    assert not np.array_equal(np.nonzero(c)[0], nz)
    # Over many seeds every index is picked about equally often.
    hits = np.zeros(x.size)
    for s in range(200):
        hits += roundtrip("randomk:0.05", x, seed=s)[0] != 0
    assert hits.min() > 0 and hits.max() < 40, (hits.min(), hits.max())


def test_sparse_k_is_ceil_of_the_written_fraction() -> None:
    # The fraction travels as a float32 (0.05f is 0.0500000007): k must still be
    # ceil(0.05 * 640) = 32, not 33, and 10% of 10 values is 1, not 2.
    for spec, n, k in (
        ("randomk:0.05", 640, 32),
        ("topk:0.05", 640, 32),
        ("randomk:0.1", 10, 1),
        ("topk:0.1", 10, 1),
        ("randomk:0.01", 8192, 82),
        ("randomk:0.3", 10, 3),
        ("randomk:0.05", 4097, 205),
    ):
        per_value = 4 if spec.startswith("randomk") else 8
        _, data = roundtrip(spec, values(n))
        assert len(data) == HEADER + per_value * k, (spec, n, (len(data) - HEADER) // per_value)


def test_dithering_is_unbiased_on_its_grid() -> None:
    levels = 8
    x = values(2000)
    m = np.abs(x).max()
    step = m / levels
    outs = np.stack([roundtrip(f"dithering:{levels}", x, seed=s)[0] for s in range(400)])
    _, data = roundtrip(f"dithering:{levels}", x)
    assert len(data) == HEADER + 4 + x.size
    # Each value lands on one of the two grid points around it, with the right sign.
    lo = np.floor(np.abs(x) / step)
    q = np.abs(outs) / step
    assert np.all(np.isclose(q, lo) | np.isclose(q, lo + 1)), "off the grid"
    assert np.all((outs == 0) | (np.sign(outs) == np.sign(x)))
    # Unbiased: the mean over seeds approaches x (standard error step/2/sqrt(400)).
    assert np.abs(outs.mean(0) - x).max() < 5 * step / 2 / np.sqrt(400)
    # All zeros stay zeros.
    z, _ = roundtrip("dithering:8", np.zeros(10, np.float32))
    assert not z.any()


@pytest.mark.parametrize(
    "text,canon",
    [
        ("topk:0.010", "topk:0.01"),
        ("onebit:ef", "onebit:ef"),
        ("dithering:16:ef", "dithering:16:ef"),
        ("", "none"),
        ("none", "none"),
        ("randomk:100", "randomk:100"),
        ("topk:0.01:ef:momentum=0.90", "topk:0.01:ef:momentum=0.9"),
        ("randomk:0.01:ef:warmup=0400", "randomk:0.01:ef:warmup=400"),
        ("topk:0.01:warmup=8", "topk:0.01:warmup=8"),
    ],
)
def test_spec_canonical_form(text: str, canon: str) -> None:
    assert _core.compression_spec(text) == canon


@pytest.mark.parametrize(
    "text,culprit",
    [
        ("zip", "unknown compressor 'zip'"),
        ("topk", "needs a parameter"),
        ("topk:abc", "'abc'"),
        ("topk:2.5", "whole count"),
        ("dithering:300", "1 to 127"),
        ("fp16:ef:ef", "unexpected field 'ef'"),
        ("none:ef", "unexpected field"),
        ("topk:0.01:momentum=0.9", "error feedback only"),
        ("onebit:ef:momentum=0.9", "top-k with error feedback"),
        ("topk:0.01:ef:momentum=1.5", "0.0001 to 0.9999"),
        ("topk:0.01:ef:momentum=x", "momentum 'x'"),
        ("topk:0.01:ef:momentum=0.9:ef", "unexpected field 'ef'"),
        ("onebit:ef:warmup=100", "fractional top-k or random-k"),
        ("randomk:100:ef:warmup=100", "fractional top-k or random-k"),
        ("randomk:0.01:ef:warmup=3", "from 4"),
        ("randomk:0.01:ef:warmup=-5", "warmup '-5'"),
        ("randomk:0.01:ef:warmup=x", "warmup 'x'"),
        ("randomk:0.01:ef:warmup=8:warmup=8", "unexpected field 'warmup=8'"),
    ],
)
def test_bad_specs_are_refused_by_name(text: str, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        _core.compression_spec(text)


def test_bad_payloads_are_refused() -> None:
    x = values(100)
    _, data = roundtrip("topk:0.1", x)
    out = np.empty_like(x)
    with pytest.raises(ValueError, match="expected 100|holds 100"):
        _core.decompress(data, 50, out.ctypes.data)
    with pytest.raises(ValueError, match="bytes of body"):
        _core.decompress(data[:-3], 100, out.ctypes.data)
    with pytest.raises(ValueError, match="shorter"):
        _core.decompress(data[:10], 100, out.ctypes.data)
    bad = bytearray(data)
    bad[HEADER : HEADER + 4] = (1000).to_bytes(4, "little")  # an index past the part
    with pytest.raises(ValueError, match="index 1000"):
        _core.decompress(bytes(bad), 100, out.ctypes.data)
    bad = bytearray(data)
    bad[4] = 99
    with pytest.raises(ValueError, match="unknown codec 99"):
        _core.decompress(bytes(bad), 100, out.ctypes.data)


def test_python_choices_per_tensor() -> None:
    c = Compression.topk(0.01, error_feedback=True, min_bytes=1024)
    assert c.spec == "topk:0.01:ef"
    assert spec_for(c, "w", 4096, "float32") == "topk:0.01:ef"
    assert spec_for(c, "b", 512, "float32") == ""  # under the size threshold
    assert spec_for(c, "i", 4096, "int32") == ""  # not a float tensor
    assert spec_for(None, "w", 4096, "float32") == ""
    sel = Compression.select(
        [
            ("*.bias", None),
            ("fc.*", Compression.onebit(error_feedback=True)),
            ("*", Compression.fp16),
        ]
    )
    assert spec_for(sel, "fc.bias", 4096, "float32") == ""
    assert spec_for(sel, "fc.weight", 4096, "float32") == "onebit:ef"
    assert spec_for(sel, "conv.weight", 4096, "bfloat16") == "fp16"
    assert Compression.from_spec("randomk:0.1:ef").spec == "randomk:0.1:ef"
    assert Compression.from_spec("none") is None
    with pytest.raises(FastPSError, match="unknown compressor"):
        Compression.from_spec("lz4")
    with pytest.raises(FastPSError, match="not one of fastps's core compressors"):
        spec_for(object(), "w", 4096, "float32")


def test_momentum_header_field_is_checked() -> None:
    # The header's 16-bit momentum (offset 6) is top-k-with-error-feedback only, below 1.
    x = values(100)
    out = np.empty_like(x)
    for spec, units in (("onebit", 9000), ("topk:0.1", 9000), ("topk:0.1:ef", 10000)):
        data = bytearray(_core.compress(spec, x.ctypes.data, x.size, 0))
        if spec.endswith(":ef"):
            data[5] = 1  # the error-feedback flag, as a worker's encoding sets it
        data[6:8] = units.to_bytes(2, "little")
        with pytest.raises(ValueError, match="momentum"):
            _core.decompress(bytes(data), 100, out.ctypes.data)
