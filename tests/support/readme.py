"""The README's library example, which a unit test runs from the source tree and an integration
test from an installed wheel."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def library_example(readme: str = README) -> tuple[str, str]:
    """The code of "Use it as a library" and the output printed under it: its first python block
    and the text block after that."""
    section = readme.split("## Use it as a library", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S)
    output = re.search(r"```python\n.*?```.*?```text\n(.*?)```", section, flags=re.S)
    assert code is not None and output is not None, "the library section lost its code or its output"
    return code.group(1), output.group(1)
