"""The time budget of tests/conftest.py reports a slow test and never fails one that passed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
CONFTEST = ROOT / "tests" / "conftest.py"


@pytest.mark.slow  # a whole pytest run of its own, over two workers
def test_a_passing_test_over_its_budget_is_listed_not_failed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the conftest's helpers come from tests/support/
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        """
        import time
        import pytest

        @pytest.mark.budget(0.01)
        def test_slow():
            time.sleep(0.1)

        def test_quick():
            pass
        """
    )
    # as tests/run runs it: over parallel workers, the report reaches the controller
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore", "-n", "2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*their time budget (reported, not failed)*", "*test_slow took *"])
    assert "test_quick took" not in result.stdout.str()
