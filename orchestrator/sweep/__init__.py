"""The sweep: the validated sweep file, the loop that schedules trials, the Optuna study, and the judge.

``config`` (the sweep file -> ``SweepConfig``, OmegaConf at the edge only), ``loop`` (what runs next and when
the sweep stops), ``study`` and ``lock`` (the Optuna study, one driver per study), ``judge`` (a finished run
-> verdict -> ``TrialRecord`` -> ledger -> Optuna -> MLflow).

May import: backends, review, calibration, planner, records, search, parity, frameworks, units
"""
