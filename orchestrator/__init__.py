"""steptune's driver side, one folder per reason to change (each folder's docstring says what it may import).

Top level: ``__main__`` (the CLI), ``docgen`` (generated docs), ``units`` (how sizes are written).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package runs from (default sweep files; shipped to Ray workers on an existing cluster)."""
