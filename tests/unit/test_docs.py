"""The docs agree with the code: generated field tables, relative links, and a README that stays a front door."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional, Union

import pytest

from orchestrator import docgen

REPO = Path(__file__).resolve().parents[2]

# Docs that other branches are writing right now; links to them are allowed to dangle until those branches are
# merged. The coordinator empties this after the merge: every other link must resolve today.
PENDING_FROM_OTHER_BRANCHES = {
}

README_MAX_LINES = 200


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_generated_field_tables_match_the_code():
    stale = docgen.stale(REPO)
    assert not stale, f"{stale}: the field tables differ from the config dataclasses; run: {docgen.FIX_COMMAND}"


@pytest.mark.parametrize("root", docgen.ROOTS, ids=lambda r: r.name)
def test_every_config_field_has_a_docstring(root):
    missing = docgen.undocumented(root)
    assert not missing, (f"fields with no docstring (add the string literal right under each field, then run "
                         f"{docgen.FIX_COMMAND}): {missing}")


# ---- the command line reference ------------------------------------------------------------------------

def _cli_block() -> str:
    text = (REPO / "docs" / "cli.md").read_text()
    return text.split("<!-- fields:begin cli -->", 1)[1].split(docgen.END_MARKER, 1)[0]


def test_cli_reference_has_every_subcommand_and_flag():
    block = _cli_block()
    missing = []
    for name, _, parser in docgen.subcommands():
        if f"### `{name}`" not in block:
            missing.append(f"subcommand {name}")
        missing += [f"{name} {flag}" for a in parser._actions for flag in a.option_strings
                    if flag not in ("-h", "--help") and f"`{flag}" not in block]
    assert not missing, f"docs/cli.md lacks {missing}; run: {docgen.FIX_COMMAND}"


def test_a_new_subcommand_makes_the_cli_reference_stale(monkeypatch):
    """What another branch's new subcommand does after a merge: the generated page shows it, and until the page is
    regenerated the docs check fails."""
    from orchestrator import __main__ as cli

    def add(p):
        p.add_argument("--log", metavar="FILE", required=True, help="the training log to read")
        p.add_argument("--limit", type=int, default=5, help="at most this many lines")

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, cli.Command("new-thing", "read a log", "Reads a log.", add,
                                                                     lambda a: 0)])
    text = docgen.render_cli()
    assert "| [`new-thing`](#new-thing) | read a log |" in text and "### `new-thing`" in text
    assert "steptune new-thing [-h] --log FILE [--limit LIMIT]" in text
    assert "| `--log FILE` | required: the training log to read |" in text
    assert "| `--limit LIMIT` | at most this many lines (default: 5) |" in text
    assert docgen.stale(REPO) == ["docs/cli.md"]


# ---- links -------------------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans (where brackets are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, flags=re.M)}


def test_every_relative_link_points_at_an_existing_file_and_heading():
    bad = []
    for doc in _docs():
        for target in _LINK.findall(_prose(doc.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            ref, _, anchor = target.partition("#")
            path = (doc.parent / ref).resolve() if ref else doc
            rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
            if rel in PENDING_FROM_OTHER_BRANCHES and not path.exists():
                continue
            if not path.exists():
                bad.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                bad.append(f"{doc.relative_to(REPO)}: {target} (no heading with that anchor)")
    assert not bad, "broken links:\n" + "\n".join(bad)


CODE_PATH = re.compile(r"\b((?:orchestrator|trainer)/[\w/]*\w(?:\.py|\.yaml)?)\b")


def test_every_code_path_the_docs_name_exists():
    """The README's flow picture and every doc name modules by path: a moved or renamed module fails here."""
    missing = []
    for doc in _docs():
        for m in CODE_PATH.finditer(doc.read_text()):
            if not (REPO / m.group(1)).exists():
                missing.append(f"{doc.relative_to(REPO)}: {m.group(1)}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


CONFIG_ARG = re.compile(r"--config[= ]+([^\s`|)\]:,;]+)")
USERS_OWN = re.compile(r"(^|/)my[-\w]*\.yaml$")
"""A file the reader writes (``my.yaml``, ``search_spaces/my.yaml``, ``my-model.yaml``): not shipped."""
NOT_SHIPPED = {
    "trainer.yaml": "steptune export writes it; docs/export.md runs it from the export folder",
    "results/winner/trainer.yaml": "the README's `export --out results/winner` right above writes it",
    "missing.yaml": "docs/trainer.md's example of the one line a missing --config file gets",
}
"""Paths the docs name on purpose without shipping them, each with the reason."""


def config_args(text: str) -> list[str]:
    """Every ``--config PATH`` a page names, placeholders (``FILE``) left out."""
    return [p for p in CONFIG_ARG.findall(text) if not p.isupper()]


def test_every_config_file_the_docs_run_exists():
    """A command a page shows with ``--config PATH`` runs as written from the repository root: the file ships."""
    missing = []
    for doc in _docs():
        for path in config_args(doc.read_text()):
            if not (REPO / path).is_file() and not USERS_OWN.search(path) and path not in NOT_SHIPPED:
                missing.append(f"{doc.relative_to(REPO)}: --config {path}")
    assert not missing, ("files the docs pass to --config that do not exist (ship them, e.g. under search_spaces/, "
                         "or name the right path):\n" + "\n".join(missing))


def test_config_args_sees_a_missing_file():
    assert config_args("`steptune profile --config tiny.yaml --ranks 2`, `--config FILE`") == ["tiny.yaml"]
    assert config_args("| `--config search_spaces/x.yaml` |") == ["search_spaces/x.yaml"]
    assert not (REPO / "tiny.yaml").exists() and not USERS_OWN.search("tiny.yaml")


def test_pending_docs_are_really_pending():
    # Once a pending doc exists on this branch its entry must go, or a later deletion would go unnoticed.
    arrived = sorted(p for p in PENDING_FROM_OTHER_BRANCHES if (REPO / p).exists())
    assert not arrived, f"remove {arrived} from PENDING_FROM_OTHER_BRANCHES in tests/unit/test_docs.py"


# ---- the README is a front door --------------------------------------------------------------------

def test_readme_is_short():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move reference text to docs/"


def test_readme_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    block = re.search(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    assert block, "README.md has no code block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make sweep", "make test"], f"README's first commands are {commands[:2]}"
    # .ci/run runs exactly the README's test command.
    assert "make test" in (REPO / ".ci" / "run").read_text()


# ---- the generator itself, on classes defined here (not in the modules it usually reads) ----------------

@dataclass(frozen=True)
class _Plain:
    kind: ClassVar[str] = "plain"
    size: int = 3
    """How big."""


@dataclass(frozen=True)
class _Fancy:
    """The fancy option."""
    kind: ClassVar[str] = "fancy"
    names: tuple[str, ...] = ("a", "b")
    """Which names."""


@dataclass(frozen=True)
class _Inner:
    """An inner section."""
    rate: Optional[float] = None
    """A rate | or none."""


@dataclass(frozen=True)
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    option: Union[_Plain, _Fancy] = field(default_factory=_Plain)
    """Pick one."""
    path: str = ""
    hidden: dict = field(default_factory=dict)


def test_render_walks_type_hints_into_sections_and_kind_options():
    root = docgen.Root("Outer", "unused.md", lambda: _Outer, skip=("hidden",))
    text = docgen.render(root)
    assert "| `inner` | section | (section) | An inner section. Fields: `inner.*` below. |" in text
    assert "| `inner.rate` | float or null | `null` | A rate \\| or none. |" in text
    assert "| `option` | one of: `kind: plain`, `kind: fancy` | `kind: plain` |" in text
    assert "#### `option: {kind: fancy}` (_Fancy)" in text and "| `option.names` | list of string | `[a, b]` |" in text
    assert "| `path` | string | `\"\"` |  |" in text
    assert "hidden" not in text
    assert docgen.undocumented(root) == [f"path ({__name__}._Outer.path)"]


def test_regenerate_replaces_only_the_marked_block():
    root = docgen.Root("Outer", "unused.md", lambda: _Outer)
    text = "intro\n<!-- fields:begin Outer -->\nold table\n<!-- fields:end -->\noutro\n"
    args = (root.name, root.doc, lambda: docgen.render(root))
    new = docgen.regenerate(text, *args)
    assert new.startswith("intro\n<!-- fields:begin Outer -->\nFields of `_Outer`") and new.endswith(
        "\n<!-- fields:end -->\noutro\n")
    assert docgen.regenerate(new, *args) == new
    with pytest.raises(ValueError, match="fields:begin Outer"):
        docgen.regenerate("no markers here\n", *args)


def test_field_docs_reads_the_string_under_each_field():
    assert docgen.field_docs(_Fancy) == {"names": "Which names."}
    assert docgen.class_doc(_Outer) == ""  # not the signature dataclasses puts in __doc__
    assert dataclasses.is_dataclass(_Outer)
