"""The package's import graph has no cycles, counting imports inside functions too.

A function-level import hides a cycle from Python (it only breaks when the import order changes), not from
the design: two modules that need each other are one concern split badly. The graph is read from the source
with ast, so no module is executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "trainer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The project module an import names (``a.b.c`` may be module a.b's attribute c)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                # A package's __init__ re-exporting its own submodules is not a dependency on the package.
                if (dep := _resolve(t, known)) and dep != mod and not mod.startswith(dep + "."):
                    graph[mod].add(dep)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_cycle_through_function_level_imports():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_reads_function_level_and_relative_imports(tmp_path):
    graph = import_graph()
    # the ray backend imports workers only inside functions (Ray is heavy): the edge must still be there.
    assert "orchestrator.backends.workers" in graph["orchestrator.backends.ray_trials"]
    assert "trainer.config" in graph["orchestrator.frameworks.megatron_flags"]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (function-level imports included): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_trainer_never_imports_the_orchestrator_ray_or_mlflow():
    known = _modules()
    bad = []
    for mod, path in known.items():
        if not mod.startswith("trainer"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{mod}: {n}" for n in names if n.split(".")[0] in ("orchestrator", "ray", "mlflow", "omegaconf")]
    assert not bad, bad


def test_imports_follow_the_rooms_rule():
    """Every import between orchestrator's folders goes the way the importing folder's docstring allows."""
    from orchestrator.rooms import rooms, violations

    bad = violations(import_graph(), rooms())
    assert not bad, "imports against the rooms' 'May import' lines (orchestrator/<room>/__init__.py):\n" + \
        "\n".join(bad)


def test_rooms_rule_sees_an_import_against_it():
    from orchestrator.rooms import Room, violations

    rule = [Room("records", "", ("parity",), ()), Room("sweep", "", ("records",), ()), Room("parity", "", (), ())]
    graph = {"orchestrator.records.ledger": {"orchestrator.sweep.loop", "orchestrator.parity.verdict",
                                             "orchestrator.units", "trainer.config"},
             "orchestrator.sweep.loop": {"orchestrator.records.ledger"},
             "orchestrator.units": {"orchestrator.parity.verdict"},
             "orchestrator.__main__": {"orchestrator.sweep.loop"}}
    assert violations(graph, rule) == [
        "orchestrator.records.ledger -> orchestrator.sweep.loop (room records may import: commands, parity, units)",
        "orchestrator.units -> orchestrator.parity.verdict (room units may import: nothing of the orchestrator)"]


def test_every_folder_is_a_room_with_a_rule(tmp_path):
    from orchestrator.rooms import PACKAGE, rooms

    folders = {p.parent.name for p in PACKAGE.glob("*/*.py")}
    assert folders == {r.name for r in rooms()}, "a folder under orchestrator/ without an __init__.py docstring"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text('"""Room a.\n\nMay import: b\n"""\n')
    with pytest.raises(ValueError, match="not rooms"):
        rooms(tmp_path)
    (tmp_path / "a" / "__init__.py").write_text('"""Room a, no rule."""\n')
    with pytest.raises(ValueError, match="May import"):
        rooms(tmp_path)


def test_trainer_follows_its_sub_packages_rule():
    """trainer/'s folders import each other only as their docstrings allow; the config imports no folder."""
    from orchestrator.rooms import TRAINER, rooms, violations

    rule = rooms(house=TRAINER)
    assert {r.name for r in rule} == {p.parent.name for p in TRAINER.package.glob("*/*.py")}
    bad = violations(import_graph(), rule, TRAINER)
    assert not bad, "imports against trainer/'s 'May import' lines (trainer/<folder>/__init__.py):\n" + "\n".join(bad)


def test_trainer_rule_sees_an_import_against_it():
    from orchestrator.rooms import TRAINER, Room, violations

    rule = [Room("model", "", (), ()), Room("parallel", "", ("model",), ())]
    graph = {"trainer.model.gpt": {"trainer.parallel.tensor_parallel", "trainer.config"},
             "trainer.parallel.parallelize": {"trainer.model.gpt", "trainer.layout"},
             "trainer.config": {"trainer.knobs", "trainer.model.gpt"},
             "trainer.knobs": {"trainer.mapping"},
             "trainer.run": {"trainer.parallel.parallelize"},
             "trainer.model.data": {"trainer.run"}}
    assert violations(graph, rule, TRAINER) == [
        "trainer.config -> trainer.model.gpt (room config may import: knobs, layout, mapping)",
        "trainer.knobs -> trainer.mapping (room knobs may import: layout)",
        "trainer.model.data -> trainer.run (room model may import: config, knobs, layout, mapping)",
        "trainer.model.gpt -> trainer.parallel.tensor_parallel (room model may import: config, knobs, layout, mapping)"]


@pytest.mark.parametrize("house", ["ORCHESTRATOR", "TRAINER"])
def test_every_top_level_module_has_its_place(house):
    """A new module at a package's root is a decision: a room, or a named place above the rooms or shared."""
    from orchestrator import rooms

    assert not getattr(rooms, house).loose(), (
        f"modules at {house.lower()}/'s root that are in no room: move each into the room it serves, or name it in "
        f"orchestrator/rooms.py's {house} (top_level or shared) with the reason")


def test_a_loose_module_is_seen(tmp_path):
    from orchestrator.rooms import House

    for name in ("__init__", "cli", "units", "helpers"):
        (tmp_path / f"{name}.py").write_text("")
    assert House(tmp_path, ("cli",), {"units": ()}).loose() == ["helpers"]
