"""What a person reviews: the table and summary in the terminal, and the MLflow mirror with its pictures.

``report`` (progress lines, the ranked table, the summary), ``tracking`` / ``tracking_lines`` /
``tracking_store`` (one MLflow parent run per sweep, a child per trial, through ``MlflowClient``),
``timeline`` and ``plots`` (the per-rank timeline, the sweep-level pictures). All read trial records; none
changes them.

May import: records, calibration, planner, search, parity, units
"""
