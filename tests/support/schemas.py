"""The message schemas (schemas/*.schema.json) as validators."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@functools.cache
def validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / f"{kind}.schema.json").read_text()))


def schema_errors(kind: str, instance: Any) -> list[str]:
    """What schemas/<kind>.schema.json finds wrong with `instance`."""
    return [error.message for error in validator(kind).iter_errors(instance)]
