"""``python command_guard.py ARGV...``: runs ARGV (torchrun) as its child and, when told to stop, kills the child's
whole process tree. Standard library only: it runs as a script in the user's working directory.

torchrun starts every rank in a session of its own, so neither one process group nor a parent's death reaches
them. The node actor starts this guard with PR_SET_PDEATHSIG = SIGTERM: when the actor dies (its node lost, the
actor killed) the guard gets SIGTERM and SIGKILLs torchrun and every rank below it at once, so nothing of the
trial outlives its actor. It also stops when its parent changes (a death signal missed) and exits with the
child's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def descendants(root: int) -> list[int]:
    """Every process below ``root``, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(root: int, include_root: bool = True) -> None:
    """SIGKILL ``root``'s descendants and their process groups (read first: an orphan's parent becomes init)."""
    tree = descendants(root)
    for pid in ([root] if include_root else []) + tree:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main(argv: list[str]) -> int:
    parent = os.getppid()
    child = subprocess.Popen(argv)

    def stop(signum: int, _frame: object) -> None:
        kill_tree(child.pid)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            rc = child.wait(timeout=1.0)
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                stop(signal.SIGTERM, None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
