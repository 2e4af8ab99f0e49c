"""One edit shared by the sweep-file tests: set (or, with None, remove) keys of a nested mapping, each key a path
whose parts are joined by "__" (so it can be a Python keyword argument: ``command__custom__log=None``)."""

from __future__ import annotations

from typing import Any


def set_nested(data: dict, changes: dict[str, Any]) -> dict:
    """``data`` with ``changes`` applied in place (missing parents made); returns ``data``."""
    for dotted, v in changes.items():
        node = data
        *path, last = dotted.split("__")
        for k in path:
            node = node.setdefault(k, {})
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    return data
