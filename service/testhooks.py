"""The one seam through which tests inject faults: NEARDUP_TEST_HOOKS names a Python file whose
`install(role)` runs once at the start of each process of the service ("worker", "signer",
"decider"), before any work. Unset, nothing is loaded and no code path knows about tests."""

from __future__ import annotations

import importlib.util
import os

HOOKS_VARIABLE = "NEARDUP_TEST_HOOKS"


def load_test_hooks(role: str) -> None:
    """Import the hooks file, if one is named, and let it install itself for `role`."""
    if not (path := os.environ.get(HOOKS_VARIABLE)):
        return
    spec = importlib.util.spec_from_file_location("neardup_test_hooks", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{HOOKS_VARIABLE}={path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install(role)
