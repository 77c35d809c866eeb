"""The `neardup` command's entry (`python -m neardup …` too)."""

import os

# neardup calls no BLAS routine: numpy's OpenBLAS would start a thread per core at import, which
# spins on CPU for nothing in the command's process (its child processes get the same: pipes.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .cli import main  # after the setting: numpy reads it when imported

if __name__ == "__main__":  # not when a signing helper process imports this module (spawn)
    raise SystemExit(main())
