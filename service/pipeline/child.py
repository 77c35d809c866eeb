"""`python -m neardup.pipeline.child MODULE`: a helper process serving MODULE's requests.

MODULE (the signer or the decider) is imported by its name rather than run as `__main__`, so that
what it sends back pickles under its real module and the test hooks can reach its functions."""

from __future__ import annotations

import importlib
import sys

from ..testhooks import load_test_hooks
from .pipes import child_main

if __name__ == "__main__":
    module = importlib.import_module(sys.argv[1])
    load_test_hooks(module.__name__.rsplit(".", 1)[-1])
    child_main(module.serve)
