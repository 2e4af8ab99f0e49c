"""steptune's driver side: the sweep loop, its backends, the ledger and its readers."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout this package runs from (default sweep files; shipped to Ray workers on an existing cluster)."""
