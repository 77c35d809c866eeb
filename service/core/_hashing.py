"""Vectorised 64-bit mixing shared by shingling, MinHash and LSH; fixed forever (state depends on it)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U64 = np.uint64
HashArray = npt.NDArray[np.uint64]

_M1 = U64(0xFF51AFD7ED558CCD)
_M2 = U64(0xC4CEB9FE1A85EC53)
_S33 = U64(33)


def fmix64(values: HashArray) -> HashArray:
    """MurmurHash3's 64-bit finaliser, in place on a fresh array: a bijection with full avalanche."""
    shifted = np.empty_like(values)  # one scratch buffer instead of a temporary per shift
    for multiplier in (_M1, _M2):
        np.right_shift(values, _S33, out=shifted)
        values ^= shifted
        values *= multiplier
    np.right_shift(values, _S33, out=shifted)
    values ^= shifted
    return values


def mix_scalar(value: int) -> int:
    """fmix64 of one Python int, for deriving seeds and constants."""
    return int(fmix64(np.array([value & 0xFFFFFFFFFFFFFFFF], dtype=U64))[0])
