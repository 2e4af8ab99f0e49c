"""Whether a sweep is finished, and how long it has run: ``results/<sweep>/run.json`` beside the ledger.

A finished sweep stays finished: rerunning the same command prints its answer and runs nothing. Only a larger
``search.n_trials`` extends it (the message says so). A sweep stopped by its wall-time budget, an error or
Ctrl-C is not finished: rerunning it resumes. Each invocation that ran is a session (start, end), so the sweep's
own running time (time to answer) leaves out the time between two commands.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Done:
    n_trials: int
    """search.n_trials the sweep finished with."""
    stopped_because: str
    """The stop line it printed."""


class Finished:
    def __init__(self, results_dir: Path):
        self.path = Path(results_dir) / "run.json"

    def _load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)  # whole or not at all: a killed driver leaves the previous file

    def read(self) -> Done | None:
        done = self._load().get("finished")
        return Done(int(done["n_trials"]), str(done["stopped_because"])) if isinstance(done, dict) else None

    def covers(self, n_trials: int) -> Done | None:
        """The finished record when the sweep is finished for a budget of ``n_trials`` (not larger)."""
        done = self.read()
        return done if done is not None and n_trials <= done.n_trials else None

    def write(self, n_trials: int, stopped_because: str) -> None:
        data = self._load()
        data["finished"] = {"n_trials": n_trials, "stopped_because": stopped_because}
        self._save(data)

    def begin(self) -> int:
        """Start a session (this invocation's running time); returns its index."""
        data = self._load()
        sessions = data.setdefault("sessions", [])
        sessions.append({"start": time.time(), "end": None})
        data.pop("finished", None)  # running again: finished again only once this run ends that way
        self._save(data)
        return len(sessions) - 1

    def end(self, index: int) -> None:
        data = self._load()
        sessions = data.get("sessions") or []
        if 0 <= index < len(sessions):
            sessions[index]["end"] = time.time()
            self._save(data)

    def sessions(self) -> list[tuple[float, float | None]]:
        """(start, end) epoch seconds of every session; end None for one a killed driver never closed."""
        return [(float(s["start"]), s.get("end")) for s in self._load().get("sessions") or []
                if isinstance(s, dict) and "start" in s]
