"""Reduction kernels (sum_into / sum_to / scale) and HMAC-SHA256 of fastps._core.

Every kernel is checked against numpy for every dtype, on every SIMD variant
this CPU can run, for sizes around the vector widths, with buffers at several
alignments (including addresses that are not a multiple of the element size),
and with guard bytes around the destination that must stay untouched.

numpy has no bfloat16: bfloat16 buffers are uint16 bit patterns here, and the
reference rounds float32 -> bfloat16 from first principles (nearest of the two
neighbours, computed in float64; ties to the even one).
"""

import hashlib
import hmac
import math
import os
import struct

import numpy as np
import pytest
from fastps import _core

INITIAL_LEVEL = _core.simd_level()
ALL_LEVELS = ["scalar", "avx2", "avx512"]


def _supported_levels():
    original = _core.simd_level()
    found = [lvl for lvl in ALL_LEVELS if _core.set_simd_level(lvl)]
    assert _core.set_simd_level(original)
    return found


LEVELS = _supported_levels()

DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int32",
    "int64",
    "uint8",
    "int8",
    "int16",
    "bool",
]
# How each dtype is held in numpy.
STORAGE = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "int8": np.int8,
    "int16": np.int16,
    "bool": np.uint8,
}
FLOATS = ("float32", "float64", "float16", "bfloat16")
SIZES = [0, 1, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 65537]
# sum_to switches to streaming stores for separate destinations of 16 MiB and
# more (kStreamMinBytes in csrc/kernels/sum.cc).
STREAM_BYTES = 16 << 20
GUARD = 0xA5


@pytest.fixture(params=LEVELS)
def level(request):
    original = _core.simd_level()
    assert _core.set_simd_level(request.param)
    assert _core.simd_level() == request.param
    yield request.param
    assert _core.set_simd_level(original)


# ---------------------------------------------------------------------------
# buffers
# ---------------------------------------------------------------------------


class Buf:
    """n elements at a chosen offset from a 64-byte boundary, inside guard bytes."""

    def __init__(self, n, dtype, byte_offset=0):
        item = np.dtype(STORAGE[dtype]).itemsize
        self.nbytes = n * item
        self.backing = np.full(self.nbytes + 256, GUARD, dtype=np.uint8)
        addr = self.backing.ctypes.data
        self.start = (-addr) % 64 + 64 + byte_offset
        raw = self.backing[self.start : self.start + self.nbytes]
        self.arr = raw.view(STORAGE[dtype])
        if n:  # numpy may not keep the address of an empty view
            assert self.arr.ctypes.data % 64 == byte_offset % 64

    @property
    def ptr(self):
        return self.arr.ctypes.data

    def guards_intact(self):
        before = self.backing[: self.start]
        after = self.backing[self.start + self.nbytes :]
        return bool(np.all(before == GUARD) and np.all(after == GUARD))


def random_values(rng, dtype, n):
    if dtype in ("float32", "float64"):
        ft = STORAGE[dtype]
        v = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 7, n)).astype(ft)
        # A share of arbitrary bit patterns: NaN, inf, subnormals, huge values.
        it = np.uint32 if dtype == "float32" else np.uint64
        bits = rng.integers(0, np.iinfo(it).max, n, dtype=it, endpoint=True).view(ft)
        pick = rng.random(n) < 0.1
        v[pick] = bits[pick]
        return v
    if dtype == "float16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)
        normal = (rng.standard_normal(n) * 100).astype(np.float16)
        return np.where(rng.random(n) < 0.5, bits, normal)
    if dtype == "bfloat16":
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        normal = (rng.standard_normal(n).astype(np.float32) * 100).view(np.uint32) >> 16
        return np.where(rng.random(n) < 0.5, bits, normal.astype(np.uint16))
    if dtype == "bool":
        return (rng.random(n) < 0.3).astype(np.uint8)
    info = np.iinfo(STORAGE[dtype])
    return rng.integers(info.min, info.max, n, dtype=STORAGE[dtype], endpoint=True)


# ---------------------------------------------------------------------------
# references
# ---------------------------------------------------------------------------


def bf16_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round float32 to bfloat16 bits: nearest neighbour in float64, ties to even."""
    f = np.asarray(f, dtype=np.float32)
    u = f.view(np.uint32)
    trunc = u & np.uint32(0xFFFF0000)  # toward zero
    up = trunc + np.uint32(0x10000)  # next bfloat16 away from zero (inf past the max)
    exp = ((u >> 23) & 0xFF).astype(np.int64)
    ulp = np.ldexp(1.0, np.maximum(exp, 1) - 127 - 7)
    lo = trunc.view(np.float32).astype(np.float64)
    fx = f.astype(np.float64)
    with np.errstate(invalid="ignore"):
        hi = lo + np.copysign(ulp, fx)
        d_lo = np.abs(fx - lo)
        d_hi = np.abs(hi - fx)
    odd = ((trunc >> 16) & 1) == 1
    take_up = (d_hi < d_lo) | ((d_hi == d_lo) & odd)
    out = np.where(take_up, up, trunc) >> 16
    nan = np.isnan(f)
    out = np.where(nan, (u >> 16) | 0x40, out)
    # Infinities: the truncation is already exact.
    out = np.where(np.isinf(f), u >> 16, out)
    return out.astype(np.uint16)


def ref_sum(dtype, a, b):
    if dtype in ("float32", "float64"):
        with np.errstate(all="ignore"):
            return a + b
    if dtype == "float16":
        with np.errstate(all="ignore"):
            return (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    if dtype == "bfloat16":
        with np.errstate(all="ignore"):
            return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b))
    if dtype == "bool":
        return ((a | b) != 0).astype(np.uint8)
    return a + b  # numpy integer arrays wrap


def ref_scale(dtype, x, factor):
    with np.errstate(all="ignore"):
        if dtype == "float32":
            return x * np.float32(factor)
        if dtype == "float64":
            return x * factor
        if dtype == "float16":
            return (x.astype(np.float32) * np.float32(factor)).astype(np.float16)
        if dtype == "bfloat16":
            return f32_to_bf16(bf16_to_f32(x) * np.float32(factor))
    if dtype == "bool":
        return x.copy()
    info = np.iinfo(STORAGE[dtype])
    v = np.trunc(x.astype(np.float64) * factor)
    return np.clip(v, info.min, info.max).astype(STORAGE[dtype])


def is_nan(dtype, x):
    if dtype == "bfloat16":
        return np.isnan(bf16_to_f32(x))
    if dtype in ("float32", "float64", "float16"):
        return np.isnan(x)
    return np.zeros(x.shape, dtype=bool)


def assert_same(dtype, got, want):
    """Bit-exact equality, except that NaNs only have to be NaN in the same places."""
    assert got.shape == want.shape
    gn, wn = is_nan(dtype, got), is_nan(dtype, want)
    bad_nan = np.flatnonzero(gn != wn)
    assert bad_nan.size == 0, f"{dtype}: NaN mismatch at {bad_nan[:10]}"
    item = np.dtype(STORAGE[dtype]).itemsize
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[item]
    g = np.ascontiguousarray(got).view(bits)[~gn]
    w = np.ascontiguousarray(want).view(bits)[~wn]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{dtype}: {bad.size} mismatches, first at {bad[:5]}: got {g[bad[:5]]} want {w[bad[:5]]}"
    )


# ---------------------------------------------------------------------------
# level selection
# ---------------------------------------------------------------------------


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def test_scalar_always_available():
    assert "scalar" in LEVELS


def test_detection_matches_cpuinfo():
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    assert ("avx2" in LEVELS) == ({"avx2", "f16c"} <= flags)
    assert ("avx512" in LEVELS) == ({"avx512f", "avx512bw", "avx2", "f16c"} <= flags)


def test_default_is_best_level():
    if os.environ.get("FASTPS_SIMD"):
        pytest.skip("FASTPS_SIMD overrides the default")
    assert INITIAL_LEVEL == LEVELS[-1]


def test_set_unknown_level_changes_nothing():
    before = _core.simd_level()
    assert _core.set_simd_level("sse9") is False
    assert _core.set_simd_level("") is False
    assert _core.simd_level() == before


def test_unknown_dtype_raises():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        _core.sum_into(a.ctypes.data, a.ctypes.data, 4, "float128")


# ---------------------------------------------------------------------------
# sum_to / sum_into / scale against numpy
# ---------------------------------------------------------------------------


def offsets_for(dtype):
    """(dst, a, b) byte offsets from a 64-byte boundary."""
    item = np.dtype(STORAGE[dtype]).itemsize
    combos = [(0, 0, 0), (item, 0, 3 * item), (3 * item, 5 * item, item), (32 + item, 0, 0)]
    if item > 1:
        combos.append((1, 3, 2))  # not even a multiple of the element size
    return combos


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_sum_to(level, dtype, n):
    rng = np.random.default_rng(1000 + n)
    for od, oa, ob in offsets_for(dtype):
        d, a, b = Buf(n, dtype, od), Buf(n, dtype, oa), Buf(n, dtype, ob)
        a.arr[:] = random_values(rng, dtype, n)
        b.arr[:] = random_values(rng, dtype, n)
        a0, b0 = a.backing.copy(), b.backing.copy()
        want = ref_sum(dtype, a.arr.copy(), b.arr.copy())
        _core.sum_to(d.ptr, a.ptr, b.ptr, n, dtype)
        assert_same(dtype, d.arr, want)
        assert d.guards_intact(), "wrote outside the destination"
        assert np.array_equal(a.backing, a0) and np.array_equal(b.backing, b0), "input changed"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_sum_into(level, dtype, n):
    rng = np.random.default_rng(2000 + n)
    for od, os_, _ in offsets_for(dtype):
        d, s = Buf(n, dtype, od), Buf(n, dtype, os_)
        d.arr[:] = random_values(rng, dtype, n)
        s.arr[:] = random_values(rng, dtype, n)
        s0 = s.backing.copy()
        want = ref_sum(dtype, d.arr.copy(), s.arr.copy())
        _core.sum_into(d.ptr, s.ptr, n, dtype)
        assert_same(dtype, d.arr, want)
        assert d.guards_intact()
        assert np.array_equal(s.backing, s0), "source changed"


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_to_aliased_destination(level, dtype):
    n = 1001
    rng = np.random.default_rng(7)
    a, b = Buf(n, dtype, 0), Buf(n, dtype, 8)
    a.arr[:] = random_values(rng, dtype, n)
    b.arr[:] = random_values(rng, dtype, n)
    want = ref_sum(dtype, a.arr.copy(), b.arr.copy())
    _core.sum_to(b.ptr, a.ptr, b.ptr, n, dtype)  # dst is b
    assert_same(dtype, b.arr, want)
    c = Buf(n, dtype, 4)
    c.arr[:] = random_values(rng, dtype, n)
    want = ref_sum(dtype, c.arr.copy(), c.arr.copy())
    _core.sum_to(c.ptr, c.ptr, c.ptr, n, dtype)  # x + x in place
    assert_same(dtype, c.arr, want)


def large_values(rng, dtype, n):
    """Big inputs whose sums are exact in every float type (small integers), so the
    reference is cheap; rounding itself is covered by the tests above."""
    if dtype == "bfloat16":
        f = rng.integers(-60, 61, n).astype(np.float32)  # |sum of three| <= 180
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    if dtype in FLOATS:
        return rng.integers(-60, 61, n).astype(STORAGE[dtype])
    return random_values(rng, dtype, n)


def exact_sum(dtype, a, b):
    if dtype == "bfloat16":
        return ((bf16_to_f32(a) + bf16_to_f32(b)).view(np.uint32) >> 16).astype(np.uint16)
    return ref_sum(dtype, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dst_offset", ["aligned", "elem"])
def test_sum_large_streaming(level, dtype, dst_offset):
    """Past the streaming-store threshold: a destination on a 64-byte boundary and
    one an element past it (unaligned head before the streaming loop), odd tail."""
    item = np.dtype(STORAGE[dtype]).itemsize
    n = STREAM_BYTES // item + 37
    off = item if dst_offset == "elem" else 0
    rng = np.random.default_rng(3)
    d, a, b = Buf(n, dtype, off), Buf(n, dtype, 0), Buf(n, dtype, 0)
    a.arr[:] = large_values(rng, dtype, n)
    b.arr[:] = large_values(rng, dtype, n)
    _core.sum_to(d.ptr, a.ptr, b.ptr, n, dtype)
    assert_same(dtype, d.arr, exact_sum(dtype, a.arr, b.arr))
    assert d.guards_intact()
    b.arr[:] = large_values(rng, dtype, n)
    want = exact_sum(dtype, d.arr, b.arr)
    _core.sum_into(d.ptr, b.ptr, n, dtype)
    assert_same(dtype, d.arr, want)
    assert d.guards_intact()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("factor", [0.5, -1.25, 1.0 / 3.0])
def test_scale(level, dtype, n, factor):
    rng = np.random.default_rng(3000 + n)
    item = np.dtype(STORAGE[dtype]).itemsize
    for off in sorted({0, item, 3 * item, 1}):
        d = Buf(n, dtype, off)
        vals = random_values(rng, dtype, n)
        if dtype == "int64":
            vals = vals >> 20  # keep |x * factor| well inside int64 and exact in double
        d.arr[:] = vals
        want = ref_scale(dtype, d.arr.copy(), factor)
        _core.scale(d.ptr, n, dtype, factor)
        assert_same(dtype, d.arr, want)
        assert d.guards_intact()


def test_bool_sum_normalises_bytes(level):
    """Any nonzero byte counts as true; the result is always 0 or 1."""
    a = np.arange(256, dtype=np.uint8).repeat(256)
    b = np.tile(np.arange(256, dtype=np.uint8), 256)
    out = np.full(a.size, 7, dtype=np.uint8)
    _core.sum_to(out.ctypes.data, a.ctypes.data, b.ctypes.data, a.size, "bool")
    assert np.array_equal(out, ((a != 0) | (b != 0)).astype(np.uint8))


def test_integer_sum_wraps(level):
    a = np.array([127, -128, 100, -1] * 20, dtype=np.int8)
    b = np.array([1, -1, 100, 1] * 20, dtype=np.int8)
    _core.sum_into(a.ctypes.data, b.ctypes.data, a.size, "int8")
    assert a[:4].tolist() == [-128, 127, -56, 0]
    x = np.full(33, np.iinfo(np.int64).max, dtype=np.int64)
    y = np.ones(33, dtype=np.int64)
    _core.sum_into(x.ctypes.data, y.ctypes.data, x.size, "int64")
    assert np.all(x == np.iinfo(np.int64).min)


def test_integer_scale_truncates_and_saturates(level):
    x = np.array([7, -7, 100, -100, 2**31 - 1, -(2**31), 3, 0], dtype=np.int32)
    _core.scale(x.ctypes.data, x.size, "int32", 2.5)
    assert x.tolist() == [17, -17, 250, -250, 2**31 - 1, -(2**31), 7, 0]
    u = np.array([10, 200, 255, 1], dtype=np.uint8)
    _core.scale(u.ctypes.data, u.size, "uint8", -1.0)
    assert u.tolist() == [0, 0, 0, 0]
    z = np.array([5, -5], dtype=np.int16)
    _core.scale(z.ctypes.data, z.size, "int16", float("nan"))
    assert z.tolist() == [0, 0]


def test_scale_bool_unchanged(level):
    x = np.array([0, 1, 1, 0, 2], dtype=np.uint8)
    _core.scale(x.ctypes.data, x.size, "bool", 0.0)
    assert x.tolist() == [0, 1, 1, 0, 2]


# ---------------------------------------------------------------------------
# 16-bit float conversions, exhaustively
# ---------------------------------------------------------------------------

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("factor", [1.0, 0.5, 1.0 / 3.0, 1.0e3, -7.0])
def test_half_scale_every_value(level, dtype, factor):
    x = ALL16.copy()
    if dtype == "float16":
        x = x.view(np.float16)
    want = ref_scale(dtype, x.copy(), factor)
    _core.scale(x.ctypes.data, x.size, dtype, factor)
    assert_same(dtype, x, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_sum_every_value(level, dtype):
    """Every 16-bit pattern plus a few addends that force ties and overflow."""
    x = ALL16.copy()
    if dtype == "float16":
        x = x.view(np.float16)
    addends = [0x0001, 0x8001, 0x3C00, 0x7BFF, 0x0400, 0x3555]  # fp16 bit patterns
    if dtype == "bfloat16":
        addends = [0x0001, 0x8001, 0x3F80, 0x7F7F, 0x0080, 0x3EAB]
    for bits in addends:
        y = np.full(x.size, bits, dtype=np.uint16)
        if dtype == "float16":
            y = y.view(np.float16)
        out = np.empty_like(x)
        _core.sum_to(out.ctypes.data, x.ctypes.data, y.ctypes.data, x.size, dtype)
        assert_same(dtype, out, ref_sum(dtype, x, y))


def test_half_nan_stays_nan(level):
    for dtype in ("float16", "bfloat16"):
        nan_bits = 0x7E00 if dtype == "float16" else 0x7FC0
        signalling = 0x7C01 if dtype == "float16" else 0x7F81
        neg = 0xFC01 if dtype == "float16" else 0xFF81
        x = np.array([nan_bits, signalling, neg, 0] * 9, dtype=np.uint16)
        y = np.zeros_like(x)
        _core.sum_into(x.ctypes.data, y.ctypes.data, x.size, dtype)
        view = x.view(np.float16) if dtype == "float16" else x
        nan = is_nan(dtype, view)
        assert nan.tolist() == [True, True, True, False] * 9


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_scale_by_nan_with_payload(level, dtype):
    """A NaN factor whose payload fills the float32 mantissa must still give NaN
    (a rounding add on such bits would carry into the sign: -0.0)."""
    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FFFFFFFFFFFFFFF))[0]
    assert math.isnan(payload_nan)
    x = np.array([0x3F80, 0x0000, 0x8001, 0x7C00, 0x1234] * 13, dtype=np.uint16)
    _core.scale(x.ctypes.data, x.size, dtype, payload_nan)
    view = x.view(np.float16) if dtype == "float16" else x
    assert bool(np.all(is_nan(dtype, view))), x[:5].tolist()


def test_bf16_reference_rounding():
    """The test's own bfloat16 reference, on hand-checked values."""
    cases = {
        0x3F800000: 0x3F80,  # 1.0
        0x3F808000: 0x3F80,  # halfway, even below
        0x3F818000: 0x3F82,  # halfway, odd below -> up
        0x3F808001: 0x3F81,  # just past halfway
        0x7F7FFFFF: 0x7F80,  # max float rounds to inf
        0x7F7F7FFF: 0x7F7F,
        0x00008000: 0x0000,  # subnormal tie to even (zero)
        0x00018000: 0x0002,
        0x80000000: 0x8000,
        0x7F800000: 0x7F80,
        0xFF800000: 0xFF80,
    }
    f = np.array(list(cases), dtype=np.uint32).view(np.float32)
    assert f32_to_bf16(f).tolist() == list(cases.values())
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], dtype=np.float32))))[0]


# ---------------------------------------------------------------------------
# HMAC-SHA256
# ---------------------------------------------------------------------------


def test_hmac_rfc4231_case1():
    got = _core.hmac_sha256(b"\x0b" * 20, b"Hi There")
    want = "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
    assert got.hex() == want


def test_hmac_rfc4231_case6_long_key():
    key = b"\xaa" * 131
    msg = b"Test Using Larger Than Block-Size Key - Hash Key First"
    want = "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
    assert _core.hmac_sha256(key, msg).hex() == want


KEY_LENS = [0, 1, 31, 32, 63, 64, 65, 100, 200]
MSG_LENS = [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100003]


@pytest.mark.parametrize("key_len", KEY_LENS)
def test_hmac_matches_python(key_len):
    rng = np.random.default_rng(key_len)
    key = rng.integers(0, 256, key_len, dtype=np.uint8).tobytes()
    for msg_len in MSG_LENS:
        msg = rng.integers(0, 256, msg_len, dtype=np.uint8).tobytes()
        got = _core.hmac_sha256(key, msg)
        assert isinstance(got, bytes) and len(got) == 32
        assert got == hmac.new(key, msg, hashlib.sha256).digest(), (key_len, msg_len)


def test_hmac_depends_on_every_input_bit():
    key, msg = b"job-secret", b"nonce-1234"
    base = _core.hmac_sha256(key, msg)
    # RFC 2104 zero-pads short keys, so a trailing zero byte gives the same MAC.
    assert _core.hmac_sha256(key + b"\x00", msg) == base
    assert _core.hmac_sha256(b"\x01" * 64 + b"\x02", msg) != _core.hmac_sha256(b"\x01" * 64, msg)
    assert _core.hmac_sha256(key, msg + b"\x00") != base
    assert _core.hmac_sha256(b"job-secreu", msg) != base
