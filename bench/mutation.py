"""Mutation testing of the decision modules: run mutmut one module at a time, then score and explain.

    python bench/mutation.py                      # every module of [tool.mutmut] only_mutate, then the report
    python bench/mutation.py --module orchestrator/search/target.py
    python bench/mutation.py --report-only --write bench/results/mutation.md

The modules and the unit tests that judge them are listed once, in pyproject.toml's ``[tool.mutmut]``
(``only_mutate`` and ``pytest_add_cli_args_test_selection``); mutmut runs each mutant against only the tests
that executed its function. Every surviving mutant must be explained: ``bench/mutation_survivors.toml`` names
the mutated line of each one that is equivalent (no input can tell it apart) with a one-line reason, and of
each one no test on a CPU machine can reach (still counted as not killed). A
survivor whose only change is the wording of a ``raise``'s message is counted apart (the error's type and
when it is raised are what the tests hold). Anything else is a gap: the report lists it with its diff, and
the command exits 1.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import shutil
import subprocess
import sys
import tokenize
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SURVIVORS = ROOT / "bench" / "mutation_survivors.toml"


def modules() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"])


def dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def unscored(module: str) -> set[str]:
    explained = tomllib.loads(SURVIVORS.read_text()) if SURVIVORS.exists() else {}
    return set(explained.get(module, {}).get("not_scored", {}).get("functions", []))


def scored_globs(module: str) -> list[str]:
    """mutmut name patterns of the module's functions and methods, less those left out of its score."""
    tree = ast.parse((ROOT / module).read_text())
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names += [f"{c.name}.{n.name}" for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    skip = unscored(module)
    return [f"{dotted(module)}.x{'ǁ' + n.replace('.', 'ǁ') if '.' in n else '_' + n}__mutmut_*"
            for n in names if n not in skip]


def run(module_list: list[str], jobs: int) -> None:
    for module in module_list:
        print(f"== mutmut run {module}", flush=True)
        # mutmut draws a progress bar; its final counts are in the report below.
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *scored_globs(module)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


@dataclass
class Score:
    module: str
    killed: int = 0
    equivalent: list[tuple[str, str]] = field(default_factory=list)
    message: list[str] = field(default_factory=list)
    gaps: list[tuple[str, str]] = field(default_factory=list)
    unreachable: list[tuple[str, str]] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    not_scored: int = 0

    @property
    def total(self) -> int:
        return (self.killed + len(self.equivalent) + len(self.message) + len(self.gaps) + len(self.unreachable)
                + sum(self.other.values()))

    @property
    def behaviour(self) -> int:
        """Mutants that change behaviour: all but the equivalent and the message-only ones."""
        return self.total - len(self.equivalent) - len(self.message)

    @property
    def score(self) -> float:
        return self.killed / self.behaviour if self.behaviour else 1.0


def _functions(name: str, path: Path) -> tuple[str, str]:
    from mutmut.mutation.diff_apply import read_functions_from_index, read_mutants_module, \
        read_mutant_function, read_original_function
    import libcst as cst

    functions = read_functions_from_index(name, path)
    if functions is None:
        module = read_mutants_module(path)
        functions = (read_original_function(module, name), read_mutant_function(module, name))
    return tuple(cst.Module([f]).code.strip() for f in functions)  # type: ignore[return-value]


def _tokens(code: str) -> list[tokenize.TokenInfo]:
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT}
    return [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip]


def message_only(orig: str, mutant: str) -> bool:
    """True when the mutant changes nothing but the text of messages: prose literals, or any literal in a raise."""
    a, b = _tokens(orig), _tokens(mutant)
    if len(a) != len(b):
        return False
    changed = [(x, y) for x, y in zip(a, b) if (x.type, x.string) != (y.type, y.string)]
    if not changed or any(x.type != tokenize.STRING or y.type != tokenize.STRING for x, y in changed):
        return False
    raises = [(n.lineno, n.end_lineno) for n in ast.walk(ast.parse(orig)) if isinstance(n, ast.Raise)]
    # Prose (a literal with a space: a note, a description, a separator of one) or anything inside a raise.
    return all(_prose(x.string) or any(lo <= x.start[0] <= hi for lo, hi in raises) for x, _ in changed)


def _prose(literal: str) -> bool:
    body = literal.lstrip("fFrRbBuU").strip("'\"")
    return " " in body


def function_of(name: str) -> str:
    """``pkg.mod.x__diffs__mutmut_3`` -> ``_diffs``; ``...xǁReferenceStoreǁadd__mutmut_1`` -> ``ReferenceStore.add``."""
    short = name.rpartition(".")[-1].rsplit("__mutmut_", 1)[0]
    return short[2:].replace("ǁ", ".") if short.startswith("xǁ") else short[2:]


def mutated_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def report(module_list: list[str]) -> tuple[list[Score], dict[str, str]]:
    os.chdir(ROOT)
    from mutmut.__main__ import SourceFileMutationData, status_by_exit_code  # noqa: F401
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    explained = tomllib.loads(SURVIVORS.read_text()) if SURVIVORS.exists() else {}
    scores, diffs = [], {}
    for module in module_list:
        data = SourceFileMutationData(path=Path(module))
        data.load()
        notes = {e["line"]: e["reason"] for e in explained.get(module, {}).get("equivalent", [])}
        cannot = {e["line"]: e["reason"] for e in explained.get(module, {}).get("unreachable", [])}
        skip = unscored(module)
        s = Score(module)
        for name, code in sorted(data.exit_code_by_key.items()):
            if function_of(name) in skip:
                s.not_scored += 1
                continue
            status = status_by_exit_code[code]
            if status == "killed":
                s.killed += 1
                continue
            if status != "survived":
                s.other[status] = s.other.get(status, 0) + 1
                continue
            diff = get_diff_for_mutant(name, path=Path(module))
            lines = mutated_lines(diff)
            short = name.rpartition(".")[-1]
            reason = next((notes[line] for line in lines if line in notes), None)
            if reason:
                s.equivalent.append((short, reason))
            elif why := next((cannot[line] for line in lines if line in cannot), None):
                s.unreachable.append((short, why))
            elif message_only(*_functions(name, Path(module))):
                s.message.append(short)
            else:
                s.gaps.append((short, lines[0] if lines else ""))
                diffs[short] = diff
        scores.append(s)
    return scores, diffs


def markdown(scores: list[Score], diffs: dict[str, str]) -> str:
    out = ["| module | mutants scored | killed | equivalent | message only | other (no tests / timeout) | "
           "not killed | killed / non-equivalent | not scored |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in scores:
        other = ", ".join(f"{k} {v}" for k, v in sorted(s.other.items())) or "0"
        out.append(f"| `{s.module}` | {s.total} | {s.killed} | {len(s.equivalent)} | {len(s.message)} | {other} | "
                   f"{len(s.gaps) + len(s.unreachable)} | {s.score:.1%} | {s.not_scored} |")
    for s in scores:
        if s.message:
            out += ["", f"### `{s.module}`: message-only survivors", "",
                    "The wording of an error or a note changed, nothing else: " + ", ".join(f"`{n}`" for n in s.message)]
        if s.equivalent:
            out += ["", f"### `{s.module}`: equivalent survivors", ""]
            out += [f"- `{name}`: {reason}" for name, reason in s.equivalent]
        if s.unreachable:
            out += ["", f"### `{s.module}`: survivors no test on this machine can reach (counted as not killed)", ""]
            out += [f"- `{name}`: {reason}" for name, reason in s.unreachable]
        if s.gaps:
            out += ["", f"### `{s.module}`: survivors not yet killed", ""]
            for name, line in s.gaps:
                out += [f"- `{name}`: `{line}`"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--module", action="append", help="a path of [tool.mutmut] only_mutate (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2: a 2-core machine)")
    p.add_argument("--report-only", action="store_true", help="score the last run without running mutmut")
    p.add_argument("--fresh", action="store_true", help="delete mutants/ first (after tests changed)")
    p.add_argument("--write", type=Path, help="also write the table and the survivors to this markdown file")
    p.add_argument("--note", help="a paragraph to put above the table in --write (e.g. the run's wall time)")
    p.add_argument("--diffs", action="store_true", help="print each unexplained survivor's diff")
    args = p.parse_args(argv)
    every = modules()
    chosen = args.module or every
    if bad := [m for m in chosen if m not in every]:
        p.error(f"--module {bad[0]}: not in [tool.mutmut] only_mutate of pyproject.toml ({', '.join(every)})")
    if not args.report_only:
        if args.fresh:
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        run(chosen, args.jobs)
    scores, diffs = report(chosen)
    text = markdown(scores, diffs)
    print(text)
    if args.diffs:
        for name, diff in diffs.items():
            print(f"# {name}\n{diff}\n")
    if args.write:
        import datetime
        from importlib.metadata import version

        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = (f"# Mutation testing of the decision modules\n\nCommand: `make mutate` (`python bench/mutation.py "
                f"--fresh`), then `python bench/mutation.py --report-only --write {args.write}`; mutmut "
                f"{version('mutmut')}, {when}. How to read it: [docs/testing.md](../../docs/testing.md#mutation-testing)."
                f"\n\n")
        args.write.write_text(head + (args.note + "\n\n" if args.note else "") + text)
    return 1 if any(s.gaps for s in scores) else 0


if __name__ == "__main__":
    sys.exit(main())
