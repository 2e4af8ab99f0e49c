"""The rooms of ``orchestrator/``: its folders, read from their ``__init__`` docstrings (with ast, importing nothing).

Each folder's docstring opens with what the room is for, names what lives there, and ends with one line
``May import: a, b, c`` (other rooms; ``nothing of the orchestrator`` for none). That line is the one
definition of the import direction: ``tests/unit/test_imports.py`` checks every import against it, and
``docgen`` renders the rooms into docs/architecture.md, so the floor plan, the rule and the docs cannot drift.
The top-level modules (the CLI, docgen, this file) may import every room; ``units`` and ``commands`` are rooms of
one module each, which every room may import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
TOP_LEVEL = ("__main__", "docgen", "rooms")
"""Modules above every room: they may import anything."""
SHARED = ("units", "commands")
"""Top-level modules every room may import (one definition each, no dependencies of their own)."""
NONE = "nothing of the orchestrator"


@dataclass(frozen=True)
class Module:
    name: str
    """File name without ``.py``."""
    summary: str
    """The first paragraph of the module's docstring."""


@dataclass(frozen=True)
class Room:
    name: str
    """The folder's name under ``orchestrator/``."""
    summary: str
    """The first paragraph of its ``__init__`` docstring: what the room is for."""
    may_import: tuple[str, ...]
    """Other rooms its modules may import (``SHARED`` modules are always allowed)."""
    modules: tuple[Module, ...]


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""


def _summary(doc: str) -> str:
    """A docstring's first paragraph on one line, rst literals as markdown ones."""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`") or "(no docstring)"


def _may_import(doc: str, where: Path) -> tuple[str, ...]:
    lines = [ln for ln in doc.splitlines() if ln.startswith("May import:")]
    if len(lines) != 1:
        raise ValueError(f"{where}: the docstring needs exactly one line 'May import: room, room' "
                         f"(or 'May import: {NONE}'); found {len(lines)}")
    value = lines[0].removeprefix("May import:").strip()
    return () if value == NONE else tuple(x.strip() for x in value.split(","))


def rooms(package: Path = PACKAGE) -> list[Room]:
    """Every folder of the package, in name order, with its rule; ValueError for a folder without one."""
    out = []
    for init in sorted(package.glob("*/__init__.py")):
        doc = _docstring(init)
        if not doc:
            raise ValueError(f"{init}: a room's __init__ needs a docstring saying what lives there")
        mods = tuple(Module(p.stem, _summary(_docstring(p)))
                     for p in sorted(init.parent.glob("*.py")) if p.name != "__init__.py")
        out.append(Room(init.parent.name, _summary(doc), _may_import(doc, init), mods))
    known = {r.name for r in out} | set(SHARED)
    for r in out:
        if unknown := set(r.may_import) - known:
            raise ValueError(f"orchestrator/{r.name}/__init__.py: 'May import' names {sorted(unknown)}, which are "
                             f"not rooms; rooms are {sorted(known)}")
    return out


def room_of(module: str) -> str | None:
    """``orchestrator.records.ledger`` -> ``records``; a top-level module -> its own name; others -> None."""
    parts = module.split(".")
    if parts[0] != "orchestrator" or len(parts) < 2:
        return None
    return parts[1]


def violations(graph: dict[str, set[str]], rule: list[Room]) -> list[str]:
    """Imports that go against the rooms' rule: ``a.b -> c.d (room a may import: ...)``."""
    allowed = {r.name: set(r.may_import) | set(SHARED) | {r.name} for r in rule}
    bad = []
    for mod, deps in sorted(graph.items()):
        src = room_of(mod)
        if src is None or src in TOP_LEVEL:
            continue
        for dep in sorted(deps):
            dst = room_of(dep)
            if dst is None or dst == src:
                continue
            if src in SHARED or dst not in allowed.get(src, set()):
                ok = ", ".join(sorted(allowed.get(src, set()) - {src})) or NONE
                bad.append(f"{mod} -> {dep} (room {src} may import: {ok})")
    return bad


def render_table(package: Path = PACKAGE) -> str:
    """The rooms as a markdown list, for docs/architecture.md: each room, its rule, its modules."""
    lines = []
    for r in rooms(package):
        lines.append(f"- **`orchestrator/{r.name}/`**: {r.summary} *May import: {', '.join(r.may_import) or NONE}.*")
        lines += [f"  - `{m.name}`: {m.summary}" for m in r.modules]
    return "\n".join(lines)
