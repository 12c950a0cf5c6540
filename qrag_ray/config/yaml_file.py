"""The one YAML reader for every file a user hands us, so a missing file or a YAML slip reads the same
everywhere: one line naming the file, the line and column, and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from qrag_ray.errors import QragError


def read_yaml(path: str | Path, what: str = "file", default: Any = None, expect: type | None = None) -> Any:
    """The parsed file (`default` when empty); QragError when missing, not YAML, or not an `expect`."""
    file = Path(path)
    if not file.is_file():
        raise QragError(f"{what} not found: {file}")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise QragError(f"{what} {file} is not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError as error:
        raise QragError(f"{what} {file} is not UTF-8 text: {error.reason} at byte {error.start}") from None
    data = default if data is None else data
    if expect is not None and not isinstance(data, expect):
        kind = {dict: "a mapping", list: "a list"}.get(expect, expect.__name__)
        raise QragError(f"{what} {file} must hold {kind} at the top level")
    return data
