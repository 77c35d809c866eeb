"""What the state tests share: a maker of fresh stores, and everything a state holds."""

from __future__ import annotations

from collections.abc import Callable

from neardup.state.index import IndexState
from neardup.state.port import StateStore

MakeState = Callable[[], StateStore]


def contents(state: IndexState) -> dict[bytes, bytes]:
    """Everything a state holds: its main family, and its records under "r"."""
    main = dict(state.kv.scan(b""))
    return {**main, **{b"r" + key: value for key, value in state.kv.scan_records()}}
