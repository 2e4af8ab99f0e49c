"""What is searched and what for: the search space and the target. Pure, no runs.

``space`` (a YAML mapping -> parameter specs -> Optuna define-by-run suggestions, ``when:``, layer splits),
``target`` (absolute, relative to the baseline, or derived from a schedule).

May import: units
"""
