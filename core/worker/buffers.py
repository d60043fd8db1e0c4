"""Turns user arrays into (address, bytes, dtype) views the C++ core can read and write.

Accepts numpy arrays, anything with the buffer protocol, and anything with ``__dlpack__``
(CPU memory). Nothing is copied: the core reads and writes the caller's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
from fastps.errors import FastPSError

# numpy dtype names the core sums (bool is summed as logical OR).
SUPPORTED_DTYPES = (
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
)


_ITEMSIZE_OF = {"bfloat16": "uint16"}
# dtype -> name: numpy computes dtype.name in Python on every access (~6 us), and a training
# step submits one buffer per gradient tensor.
_NAME_OF: Dict[np.dtype, str] = {}


def _ctypes_address(obj: Any) -> int:
    return int(obj.ctypes.data)


try:  # the core reads the address through the buffer protocol, ~15x cheaper than ctypes
    from fastps._core import buffer_address as _buffer_address
except ImportError:  # pragma: no cover - only without a built core (launcher, scheduler)
    _buffer_address = _ctypes_address


def address_of(arr: np.ndarray) -> int:
    """The address of a contiguous array's first byte."""
    try:
        return int(_buffer_address(arr))
    except (BufferError, ValueError, TypeError):  # a dtype without a buffer format
        return _ctypes_address(arr)


@dataclass
class RawBuffer:
    """A contiguous region of host memory plus what it holds."""

    ptr: int
    nbytes: int
    dtype: str
    shape: Tuple[int, ...]
    owner: Any  # keeps the memory alive while the core uses it


def as_numpy(obj: Any, what: str = "tensor") -> np.ndarray:
    """A zero-copy numpy view of obj, or a FastPSError naming what is wrong."""
    if isinstance(obj, np.ndarray):
        arr = obj
    elif hasattr(obj, "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            arr = np.from_dlpack(obj)
        except (TypeError, RuntimeError, BufferError) as exc:
            raise FastPSError(
                f"{what}: cannot view {type(obj).__name__} through DLPack ({exc}); "
                "pass host (CPU) memory or use the framework plugin"
            ) from None
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            raise FastPSError(
                f"{what}: {type(obj).__name__} is neither a numpy array, a buffer nor a "
                "DLPack tensor"
            ) from None
    if not arr.flags.c_contiguous:
        raise FastPSError(f"{what}: array of shape {arr.shape} is not C-contiguous")
    return arr


def raw_buffer(
    obj: Any, what: str = "tensor", writable: bool = False, dtype: Optional[str] = None
) -> RawBuffer:
    """``dtype`` reinterprets the memory (e.g. uint16 bit patterns as "bfloat16")."""
    arr = as_numpy(obj, what)
    name = _NAME_OF.get(arr.dtype)
    if name is None:
        name = _NAME_OF.setdefault(arr.dtype, arr.dtype.name)
    if dtype is not None and dtype != name:
        if (
            dtype not in SUPPORTED_DTYPES
            or np.dtype(_ITEMSIZE_OF.get(dtype, dtype)).itemsize != arr.dtype.itemsize
        ):
            raise FastPSError(f"{what}: cannot treat {name} elements as {dtype}")
        name = dtype
    if name not in SUPPORTED_DTYPES:
        raise FastPSError(f"{what}: dtype {name} is not supported (supported: {SUPPORTED_DTYPES})")
    if writable and not arr.flags.writeable:
        raise FastPSError(f"{what}: output array is read-only")
    return RawBuffer(address_of(arr), int(arr.nbytes), name, tuple(arr.shape), arr)
