"""GPU tier setup: runs on whatever CUDA torch a machine already has, without the project's install step.

    PYTHONPATH=. python3 -m pytest tests/gpu -q

Needs torch (a CUDA build) and numpy; nothing else of the project's dependencies (no Ray, Optuna, MLflow;
pytest-timeout and nvtx are used when present). Without CUDA every test skips with its reason, and the
modules still import, so a CPU-only CI collects them.
"""

from __future__ import annotations


def pytest_configure(config):
    # The project's timeouts come from pytest-timeout; a bare machine may not have it, and the mark must not warn.
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's limit (inactive without the plugin)")
