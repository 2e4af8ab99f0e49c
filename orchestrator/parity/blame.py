"""The stop message's last sentence: which layout family (or pair of families) computes something else.

Pure: it reads the suspects' runs as the sweep recorded them (orchestrator.parity.trust.ParityGate.try_suspect):
(name, agreed with the canonical run or None when it did not run, what happened), where a name is one family's
("recompute") or a pair's, set back together ("data_parallel.overlap_grad_reduce + recompute"). ``within`` maps a
family to the wider family whose reset makes it inert (trust.FAMILIES): of two agreeing resets, one within the
other, the narrower is named.
"""

from __future__ import annotations

from typing import Mapping, Sequence

PAIR = " + "
"""How a pair of families set back together is named in the suspects' runs."""


def pair_name(a: str, b: str) -> str:
    return f"{a}{PAIR}{b}"


def _covers(wide: str, narrow: str, within: Mapping[str, str | None]) -> bool:
    """Setting ``wide`` back also sets ``narrow`` back (it is the same family, or ``narrow`` lives within it)."""
    return wide == narrow or within.get(narrow) == wide


def _narrowest(agreed: list[str], within: Mapping[str, str | None]) -> list[str]:
    """The agreeing resets no other agreeing reset is narrower than (each of its families covers one of the other's)."""
    parts = {name: name.split(PAIR) for name in agreed}

    def narrower(a: str, b: str) -> bool:  # a is narrower than b
        return a != b and all(any(_covers(w, n, within) for w in parts[b]) for n in parts[a]) \
            and len(parts[a]) <= len(parts[b])
    return [n for n in agreed if not any(narrower(m, n) for m in agreed)]


def sentence(tried: Sequence[tuple[str, bool | None, str]], within: Mapping[str, str | None]) -> str:
    """One sentence from the suspects' runs: the family (or, when none alone agrees, the pair) whose reset makes the
    baseline agree with the canonical run, or each reset's own difference when none does."""
    if not tried:
        return ""
    singles = [t for t in tried if PAIR not in t[0]]
    pairs = [t for t in tried if PAIR in t[0]]
    named = _narrowest([name for name, ok, _ in singles if ok], within)
    if len(named) == 1:
        return (f"Set back to canonical alone, {named[0]} makes it agree with the canonical run: that knob computes "
                f"something else.")
    if named:
        return (f"Set back to canonical alone, each of {', '.join(named)} makes it agree with the canonical run: "
                f"one of them computes something else.")
    how = "; ".join(f"{name}: {what}" for name, _, what in singles)
    together = _narrowest([name for name, ok, _ in pairs if ok], within)
    if len(together) == 1:
        a, b = together[0].split(PAIR)
        return (f"No one family set back to canonical alone makes it agree ({how}); set back together, {a} and {b} "
                f"make it agree: both compute something else (or the two interact).")
    if together:
        return (f"No one family set back to canonical alone makes it agree ({how}); set back together, each of the "
                f"pairs {', '.join('(' + p.replace(PAIR, ', ') + ')' for p in together)} makes it agree: the two "
                f"of one of them compute something else.")
    if pairs:
        return (f"No one family set back to canonical makes it agree ({how}), nor do any two of them set back together "
                f"({len(pairs)} pairs): more than two compute something else, or the maths differ.")
    return (f"No one family set back to canonical makes it agree ({how}): more than one computes something else, "
            f"or the maths differ.")
