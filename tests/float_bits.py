"""float32 values and their bit patterns, and numpy's IEEE float16 conversion, for
the packing tests."""

from __future__ import annotations

import numpy as np


def float32_of_bits(bits: np.ndarray | list[int]) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def float32_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def ieee_half_bits(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(np.float16).view(np.uint16)
