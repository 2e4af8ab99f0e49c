#!/usr/bin/env bash
# Create .venv and install steptune with its pinned dependencies (idempotent; quick when up to date).
# CPU (default): torch 2.13.0 CPU build. GPU: STEPTUNE_TORCH_INDEX=https://download.pytorch.org/whl/cu128
# installs the CUDA build of the same torch version first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.steptune-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ -n "${STEPTUNE_TORCH_INDEX:-}" ]; then
  .venv/bin/python -m pip install -q torch==2.13.0 --index-url "$STEPTUNE_TORCH_INDEX"
fi
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
echo "$want" > "$stamp"
