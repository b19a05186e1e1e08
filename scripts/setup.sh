#!/usr/bin/env bash
# Create .venv (Python >= 3.11 preferred, 3.10 works) with autopar and its dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3 python3.10; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v -E "^(WARNING: Location|  )" || true
.venv/bin/python -c 'import autopar, autopar_solver.planner, autopar_cache, autopar_service' >/dev/null
# compile the solver's numba kernels once (numba's cache, next to the sources), so the
# first plan does not spend seconds of its time limit compiling them
.venv/bin/python -m autopar_solver.bounds
