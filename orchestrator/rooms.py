"""The rooms of ``orchestrator/`` and of ``trainer/``: their folders, read from their ``__init__`` docstrings (with ast,
importing nothing).

Each folder's docstring opens with what the room is for, names what lives there, and ends with one line
``May import: a, b, c`` (other rooms of the same package; ``nothing of the orchestrator`` or ``no other
sub-package`` for none). That line is the one definition of the import direction: ``tests/unit/test_imports.py``
checks every import against it, and ``docgen`` renders the rooms into docs/architecture.md, so the floor plan, the
rule and the docs cannot drift. A package's top-level modules are of two kinds, named here (``House``): those above
every room (entry points, tooling), which may import every room and which no room imports; and shared ones, which
every room may import and which import only the shared modules named for them. In the orchestrator those are the
CLI, docgen and this file (above), ``units`` and ``commands`` (shared, importing nothing); in the trainer the entry
points ``__main__``, ``launch`` and ``run`` (above) and the config every sub-package reads (shared).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
TOP_LEVEL = ("__main__", "docgen", "rooms")
"""Modules above every room: they may import anything."""
SHARED = ("units", "commands")
"""Top-level modules every room may import (one definition each, no dependencies of their own)."""
NONE = "nothing of the orchestrator"


@dataclass(frozen=True)
class House:
    """A package whose folders are rooms, and what its top-level modules are."""

    package: Path
    top_level: tuple[str, ...]
    """Top-level modules above every room: they may import anything, and no room imports them."""
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Top-level modules every room may import -> the other shared modules each may import (nothing else)."""
    none: str = NONE
    """What a ``May import:`` line says for no other room."""

    @property
    def name(self) -> str:
        return self.package.name

    def loose(self) -> list[str]:
        """Top-level modules that are neither above the rooms nor shared: each needs a decision (a room, or a place
        in ``top_level`` / ``shared`` with its reason)."""
        placed = {"__init__", *self.top_level, *self.shared}
        return sorted(p.stem for p in self.package.glob("*.py") if p.stem not in placed)


ORCHESTRATOR = House(PACKAGE, TOP_LEVEL, {name: () for name in SHARED})
TRAINER = House(PACKAGE.parent / "trainer", ("__main__", "launch", "run"),
                {"layout": (), "mapping": (), "knobs": ("layout",), "config": ("knobs", "layout", "mapping")},
                "no other sub-package")
"""trainer/: the entry points (``python -m trainer``, the local launcher, one measured run: where model, parallel and
measure meet) above its sub-packages; the config every sub-package reads (``config``, ``knobs``, and ``layout`` and
``mapping``, the arithmetic and the mapping it is validated and built with) below them."""
HOUSES = (ORCHESTRATOR, TRAINER)


@dataclass(frozen=True)
class Module:
    name: str
    """File name without ``.py``."""
    summary: str
    """The first paragraph of the module's docstring."""


@dataclass(frozen=True)
class Room:
    name: str
    """The folder's name under its package (``orchestrator/``, ``trainer/``)."""
    summary: str
    """The first paragraph of its ``__init__`` docstring: what the room is for."""
    may_import: tuple[str, ...]
    """Other rooms its modules may import (the house's shared modules are always allowed)."""
    modules: tuple[Module, ...]


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""


def _summary(doc: str) -> str:
    """A docstring's first paragraph on one line, rst literals as markdown ones."""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "`") or "(no docstring)"


def _may_import(doc: str, where: Path, none: str = NONE) -> tuple[str, ...]:
    lines = [ln for ln in doc.splitlines() if ln.startswith("May import:")]
    if len(lines) != 1:
        raise ValueError(f"{where}: the docstring needs exactly one line 'May import: room, room' "
                         f"(or 'May import: {none}'); found {len(lines)}")
    value = lines[0].removeprefix("May import:").strip()
    return () if value == none else tuple(x.strip() for x in value.split(","))


def rooms(package: Path | None = None, house: House = ORCHESTRATOR) -> list[Room]:
    """Every folder of the house's package (or of ``package``, read by the house's rules), in name order, with its
    rule; ValueError for a folder without one."""
    package = house.package if package is None else package
    out = []
    for init in sorted(package.glob("*/__init__.py")):
        doc = _docstring(init)
        if not doc:
            raise ValueError(f"{init}: a room's __init__ needs a docstring saying what lives there")
        mods = tuple(Module(p.stem, _summary(_docstring(p)))
                     for p in sorted(init.parent.glob("*.py")) if p.name != "__init__.py")
        out.append(Room(init.parent.name, _summary(doc), _may_import(doc, init, house.none), mods))
    known = {r.name for r in out} | set(house.shared)
    for r in out:
        if unknown := set(r.may_import) - known:
            raise ValueError(f"{house.name}/{r.name}/__init__.py: 'May import' names {sorted(unknown)}, which are "
                             f"not rooms; rooms are {sorted(known)}")
    return out


def room_of(module: str, house: House = ORCHESTRATOR) -> str | None:
    """``orchestrator.records.ledger`` -> ``records``; a top-level module -> its own name; others -> None."""
    parts = module.split(".")
    if parts[0] != house.name or len(parts) < 2:
        return None
    return parts[1]


def violations(graph: dict[str, set[str]], rule: list[Room], house: House = ORCHESTRATOR) -> list[str]:
    """Imports that go against the rooms' rule: ``a.b -> c.d (room a may import: ...)``."""
    allowed = {r.name: set(r.may_import) | set(house.shared) | {r.name} for r in rule}
    allowed |= {name: set(deps) | {name} for name, deps in house.shared.items()}
    bad = []
    for mod, deps in sorted(graph.items()):
        src = room_of(mod, house)
        if src is None or src in house.top_level:
            continue
        for dep in sorted(deps):
            dst = room_of(dep, house)
            if dst is None or dst == src:
                continue
            if dst not in allowed.get(src, set()):
                ok = ", ".join(sorted(allowed.get(src, set()) - {src})) or house.none
                bad.append(f"{mod} -> {dep} (room {src} may import: {ok})")
    return bad


def render_table(house: House = ORCHESTRATOR) -> str:
    """The rooms as a markdown list, for docs/architecture.md: the top-level modules, then each room, its rule, its
    modules."""
    def top(names) -> list[str]:
        return [f"  - `{n}`: {_summary(_docstring(house.package / f'{n}.py'))}" for n in names]

    lines = [f"- **`{house.name}/`, above every room** (may import every room): "
             + ", ".join(f"`{n}`" for n in house.top_level) + ".", *top(house.top_level),
             f"- **`{house.name}/`, shared** (every room may import them): "
             + ", ".join(f"`{n}`" for n in house.shared) + ".", *top(house.shared)]
    for r in rooms(house=house):
        rule = ", ".join(r.may_import) or house.none
        lines.append(f"- **`{house.name}/{r.name}/`**: {r.summary} *May import: {rule}.*")
        lines += [f"  - `{m.name}`: {m.summary}" for m in r.modules]
    return "\n".join(lines)
