"""The test hooks' seam (service/testhooks.py) and the faults loaded through it (tests/support/faults.py):
nothing happens unless NEARDUP_TEST_HOOKS names a file, and then its `install(role)` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from neardup.pipeline import decider, signer
from neardup.testhooks import HOOKS_VARIABLE, load_test_hooks
from tests.support.faults import AGENT_FAULT, HELPER_FAULT, install, parse_agent_fault, parse_helper_fault


def test_no_hooks_file_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOOKS_VARIABLE, raising=False)
    real = signer.sign_batch
    load_test_hooks("signer")
    assert signer.sign_batch is real


def test_a_hooks_file_is_installed_for_the_role(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    marker = tmp_path / "installed"
    hooks.write_text(f"def install(role):\n    open({str(marker)!r}, 'w').write(role)\n")
    monkeypatch.setenv(HOOKS_VARIABLE, str(hooks))
    load_test_hooks("decider")
    assert marker.read_text() == "decider"
    monkeypatch.setenv(HOOKS_VARIABLE, str(tmp_path / "missing.txt"))
    with pytest.raises((ValueError, FileNotFoundError)):
        load_test_hooks("worker")


def test_a_helper_fault_reaches_only_its_kind_of_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HELPER_FAULT, "crash:signer:3")
    monkeypatch.delenv(AGENT_FAULT, raising=False)
    real_sign, real_decide = signer.sign_batch, decider.decide_messages
    install("decider")
    assert decider.decide_messages is real_decide
    install("signer")
    assert signer.sign_batch is not real_sign and signer.sign_batch.__wrapped__ is real_sign  # type: ignore[attr-defined]
    monkeypatch.setattr(signer, "sign_batch", real_sign)


def test_fault_specs_are_checked() -> None:
    assert parse_helper_fault("hang:decider:2") == ("hang", "decider", 2)
    assert parse_agent_fault("raise:index:1") == ("raise", "index", 1, 0.0)
    assert parse_agent_fault("delay:index:2:50") == ("delay", "index", 2, 0.05)
    for bad in ("sleep:signer:1", "hang:worker:1", "hang:signer", "crash:signer:x"):
        with pytest.raises(ValueError, match=HELPER_FAULT):
            parse_helper_fault(bad)
    assert parse_agent_fault("delay:verdicts:1:5") == ("delay", "verdicts", 1, 0.005)
    for bad in ("raise:decider:1", "delay:sign:1:5", "raise:index", "delay:index:1:x"):
        with pytest.raises(ValueError, match=AGENT_FAULT):
            parse_agent_fault(bad)
