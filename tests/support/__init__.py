"""Helpers that more than one test module uses.

A test module never imports another test module (tests/unit/test_imports_between_tests.py checks it): pytest
imports each test module under its own name, so a second import by path makes a second copy of
the module, its state and its tests' collection, and the module's tests stop being its own to change.
"""
