"""Helpers that more than one test module uses.

A test module never imports another test module, nor a conftest.py
(tests/unit/test_imports_between_tests.py checks both): pytest imports each test module and each
conftest under its own name, so a second import by path makes a second copy of the module, its
state and its tests' collection. A conftest holds fixtures and hooks, which pytest hands to tests
itself; the plain names they share (constants, classes, functions) live here.
"""
