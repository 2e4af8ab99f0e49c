"""steptune's driver side, one folder per reason to change (each folder's docstring says what it may import).

Five modules stay at the top level, each for a reason (``orchestrator.rooms.ORCHESTRATOR`` names them; a test fails
for any other): ``__main__`` is the CLI, above every room it dispatches to; ``docgen`` renders every room's config,
parsers and docstrings into docs/, so it sits above them with the CLI; ``rooms`` reads every folder's rule, about
the house rather than in it; ``units`` (how sizes are written) and ``commands`` (how a printed command is spelled)
are one definition each that every room imports, rooms of one module.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package runs from (default sweep files; shipped to Ray workers on an existing cluster)."""
