"""Types of the compiled loops (_sketch.c); the numpy code in minhash.py is their reference."""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def oph_minima(
    units: npt.NDArray[np.uint64], k: int, seed_key: int, minima: npt.NDArray[np.uint64]
) -> int: ...
def agreements(
    query: npt.NDArray[np.uint8], others: Sequence[npt.NDArray[np.uint8]], empty: int
) -> tuple[bytes, bytes]: ...
