"""Field tables for docs/, generated from the config dataclasses: ``python -m orchestrator.docgen [--check]``.

The same for the command line: docs/cli.md's subcommands and flags are read from the argparse parsers
(``render_cli``), the rooms' lists in docs/architecture.md (the orchestrator's and the trainer's) from their
docstrings.

Each documented root (the sweep file's ``SweepConfig``, the trainer's ``TrainConfig``) is walked through its
type hints, so a section class found here is documented wherever it is defined: moving a dataclass to another
module changes nothing. A field's meaning is its docstring (the string literal right under it, read with
``ast``); a nested section without one borrows its class docstring. ``kind:`` unions become one table per
option. The tables sit between ``<!-- fields:begin NAME -->`` and ``<!-- fields:end -->`` in the docs file;
everything outside the markers is hand-written and left alone.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

REPO_ROOT = Path(__file__).resolve().parent.parent
FIX_COMMAND = "make docs  (= python -m orchestrator.docgen)"
END_MARKER = "<!-- fields:end -->"


@dataclass(frozen=True)
class Root:
    """One generated block: a root dataclass and the docs file that holds its tables."""
    name: str
    """The block's name in its begin marker."""
    doc: str
    """Docs file, relative to the repository root."""
    load: Any
    """Returns the root class (imported lazily, so this module imports nothing heavy on its own)."""
    prefix: str = ""
    """Dotted prefix of the root's fields as the user writes them (e.g. ``trainer.`` in a sweep file)."""
    skip: tuple[str, ...] = ()
    """Root fields that are not keys of the file (set by the loader)."""
    opaque: tuple[str, ...] = ()
    """Fields with their own hand-written section: listed, not descended into."""
    elsewhere: tuple[tuple[str, str], ...] = ()
    """(dotted section, the docs page that holds its tables): a section documented by a root of its own there."""


def _sweep_root() -> type:
    from orchestrator.sweep.config import SweepConfig

    return SweepConfig


def _custom_root() -> type:
    from orchestrator.frameworks.custom import CustomFramework

    return CustomFramework


def _trainer_root() -> type:
    from trainer.config import TrainConfig

    return TrainConfig


ROOTS = (
    Root("SweepConfig", "docs/sweep.md", _sweep_root, skip=("source", "raw", "built"), opaque=("space", "target"),
         elsewhere=(("command.custom", "docs/frameworks.md#your-own-trainer"),)),
    Root("CustomFramework", "docs/frameworks.md", _custom_root, prefix="command.custom."),
    Root("TrainConfig", "docs/trainer.md", _trainer_root),
)


# ---- reading the classes -----------------------------------------------------------------------

def _class_node(cls: type) -> ast.ClassDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef), cls
    return node


def class_doc(cls: type) -> str:
    """The class's own docstring (not the signature dataclasses puts in ``__doc__`` when there is none)."""
    return _squash(ast.get_docstring(_class_node(cls)) or "")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right under its annotation, for ``cls`` and its dataclass bases."""
    out: dict[str, str] = {}
    for base in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        body = _class_node(base).body
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                out[stmt.target.id] = _squash(inspect.cleandoc(nxt.value.value))
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def _members(tp: Any) -> tuple[list[Any], bool]:
    """A hint's members without None, and whether None is allowed."""
    if typing.get_origin(tp) in (Union, getattr(__import__("types"), "UnionType", Union)):
        args = typing.get_args(tp)
        return [a for a in args if a is not type(None)], type(None) in args
    return [tp], False


def _is_option(cls: type) -> bool:
    """A member of a ``kind:`` union: ``kind`` is a class constant, not a field."""
    return (dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "kind", None), str)
            and "kind" not in {f.name for f in dataclasses.fields(cls)})


def _variants(tp: Any) -> list[type]:
    """The option classes of a ``kind:`` union (empty for anything else)."""
    members, _ = _members(tp)
    return members if len(members) > 1 and all(map(_is_option, members)) else []


def _section(tp: Any) -> type | None:
    members, _ = _members(tp)
    return members[0] if len(members) == 1 and dataclasses.is_dataclass(members[0]) else None


# ---- rendering ---------------------------------------------------------------------------------

def type_name(tp: Any) -> str:
    """A hint as a sweep/trainer YAML author reads it."""
    if tp is Any:
        return "any"
    members, nullable = _members(tp)
    if len(members) > 1:
        if _variants(tp):
            return "one of: " + ", ".join(f"`kind: {m.kind}`" for m in members)
        text = " or ".join(type_name(m) for m in members)
    else:
        tp = members[0]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            text = "section"
        elif origin in (tuple, list):
            text = f"list of {type_name(args[0])}" if args else "list"
        elif tp is dict or origin is dict:
            text = "mapping"
        elif tp is list:
            text = "list"
        elif isinstance(tp, type):
            text = {"str": "string", "bool": "bool", "int": "int", "float": "float"}.get(tp.__name__, tp.__name__)
        else:
            text = str(tp)
    return text + (" or null" if nullable else "")


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def default_text(f: dataclasses.Field) -> str:
    """The default as YAML; a ``kind:`` option by its kind, a nested section as "(section)"."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return f"`kind: {type(value).kind}`" if _is_option(type(value)) else "(section)"
    if value == "":
        return '`""`'
    return f"`{_yaml(value)}`"


def _cell(text: str) -> str:
    """Table-safe: a ``|`` would end the cell, a ``<name>`` would be read as an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _table(cls: type, path: str, missing: list[str], skip: tuple[str, ...] = (),
           opaque: tuple[str, ...] = (), elsewhere: tuple[tuple[str, str], ...] = ()) -> tuple[list[str], list]:
    """Rows of one class's table, and the (path, type) of the sections and unions to document after it.

    Fields with no meaning at all (no docstring; a section: no class docstring either) go to ``missing``.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested: list = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp, dotted = hints[f.name], f"{path}{f.name}"
        meaning, default, more = docs.get(f.name, ""), default_text(f), ""
        if f.name in opaque:
            default, more = "-", "Format: its own section of this page."
        elif dotted in dict(elsewhere):
            more = f"Fields: [{dict(elsewhere)[dotted]}]({dict(elsewhere)[dotted].removeprefix('docs/')})."
        elif _section(tp) is not None:
            meaning = meaning or class_doc(_section(tp))  # type: ignore[arg-type]
            more = f"Fields: `{dotted}.*` below."
            nested.append((dotted, tp))
        elif _variants(tp):
            more = f"Options: `{dotted}` below."
            nested.append((dotted, tp))
        if not meaning:
            missing.append(f"{dotted} ({cls.__module__}.{cls.__qualname__}.{f.name})")
        text = " ".join(t for t in (meaning, more) if t)
        rows.append(f"| `{dotted}` | {_cell(type_name(tp))} | {_cell(default)} | {_cell(text)} |")
    return rows, nested


def _render(root: Root) -> tuple[str, list[str]]:
    cls = root.load()
    missing: list[str] = []
    rows, todo = _table(cls, root.prefix, missing, root.skip, root.opaque, root.elsewhere)
    out = [f"Fields of `{cls.__name__}` (the top level):", "", *rows]
    while todo:
        dotted, tp = todo.pop(0)
        section = _section(tp)
        options = [section] if section is not None else _variants(tp)
        for opt in options:
            title = f"`{dotted}`" if section is not None else f"`{dotted}: {{kind: {opt.kind}}}`"
            out += ["", f"#### {title} ({opt.__name__})", ""]
            if class_doc(opt):
                out += [class_doc(opt), ""]
            sub_rows, sub = _table(opt, dotted + ".", missing, elsewhere=root.elsewhere)
            out += sub_rows if len(sub_rows) > 2 else ["No other fields."]
            todo[:0] = sub  # depth first: pipeline.split's options right after pipeline's table
    return "\n".join(out), missing


def render(root: Root) -> str:
    """The Markdown between a root's markers: its table, then each nested section's, depth first."""
    return _render(root)[0]


def undocumented(root: Root) -> list[str]:
    """Fields of the root's tree whose table row would have no meaning (every field needs a docstring)."""
    return _render(root)[1]


# ---- the command line ----------------------------------------------------------------------------

USAGE_WIDTH = 110
"""Columns of the generated usage lines (fixed: the terminal's width must not change the docs)."""


def subcommands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, as ``steptune --help`` builds them."""
    from orchestrator.__main__ import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(c.name, c.help, sub.choices[c.name]) for c in COMMANDS]


def _flag(action: argparse.Action) -> str:
    """How a flag is written: ``--out DIR`` (aliases after it), a positional by its metavar."""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if not action.option_strings:
        return f"`{metavar} ...`" if action.nargs in ("*", "+") else f"`{metavar}`"
    arg = "" if action.nargs == 0 else f" {metavar}"
    first, *aliases = action.option_strings
    return f"`{first}{arg}`" + "".join(f" (also `{a}`)" for a in aliases)


def _meaning(action: argparse.Action, prog: str) -> str:
    text = (action.help or "") % {**vars(action), "prog": prog} if "%(" in (action.help or "") else action.help or ""
    if action.required and action.option_strings:
        text = f"required: {text}"
    if (action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text
            and action.nargs != 0):
        text += f" (default: {action.default})"
    if action.choices:
        text += " (one of: " + ", ".join(map(str, action.choices)) + ")"
    return text


def render_cli() -> str:
    """docs/cli.md's reference: the subcommands' table, then per subcommand its usage, description and flags,
    read from the argparse parsers themselves, so a new subcommand or flag appears here by itself."""
    commands = subcommands()
    out = ["| subcommand | what it does |", "| --- | --- |"]
    out += [f"| [`{name}`](#{name}) | {_cell(text)} |" for name, text, _ in commands]
    for name, _, parser in commands:
        usage = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
        usage.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
        out += ["", f"### `{name}`", "", "```", usage.format_help().strip(), "```", ""]
        if parser.description:
            out += [_squash(parser.description).replace("<", "&lt;"), ""]
        rows = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        out += ["| flag | meaning |", "| --- | --- |"] if rows else ["No flags."]
        out += [f"| {_cell(_flag(a))} | {_cell(_meaning(a, parser.prog))} |" for a in rows]
    return "\n".join(out)


# ---- the docs files ------------------------------------------------------------------------------

def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- fields:begin {re.escape(name)} -->\n)(.*?)(^{re.escape(END_MARKER)})", re.S | re.M)


def blocks() -> list[tuple[str, str, Callable[[], str]]]:
    """Every generated block: (name in its begin marker, docs file, renderer)."""
    from orchestrator import rooms

    return [(r.name, r.doc, lambda r=r: render(r)) for r in ROOTS] + [
        ("rooms", "docs/architecture.md", rooms.render_table),
        ("trainer-rooms", "docs/architecture.md", lambda: rooms.render_table(rooms.TRAINER)),
        ("cli", "docs/cli.md", render_cli)]


def regenerate(text: str, name: str, doc: str, generate: Callable[[], str]) -> str:
    """``text`` with the named block replaced by freshly generated text; ValueError without markers."""
    pattern = _block(name)
    if not pattern.search(text):
        raise ValueError(f"{doc}: no '<!-- fields:begin {name} -->' ... '{END_MARKER}' block; add one "
                         f"where the {name} tables belong")
    generated = generate()
    return pattern.sub(lambda m: m.group(1) + generated + "\n" + m.group(3), text, count=1)


def stale(repo: Path = REPO_ROOT) -> list[str]:
    """Docs files whose generated blocks differ from the code (empty: all current)."""
    return sorted({doc for name, doc, gen in blocks()
                   if regenerate((repo / doc).read_text(), name, doc, gen) != (repo / doc).read_text()})


def write(repo: Path = REPO_ROOT) -> list[str]:
    """Regenerate every block in place; returns the files that changed."""
    changed = []
    for name, doc, gen in blocks():
        path = repo / doc
        text = path.read_text()
        new = regenerate(text, name, doc, gen)
        if new != text:
            path.write_text(new)
            changed.append(doc)
    return sorted(set(changed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.docgen", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a docs file is out of date; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for doc in bad:
            print(f"{doc}: generated tables differ from the code; run: {FIX_COMMAND}")
        return 1 if bad else 0
    for doc in write():
        print(f"updated {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
