#!/usr/bin/env bash
# Create (or reuse) the OneFlow 0.9 venv the OneFlow bridge and its tests run in.
#
#   bash scripts/oneflow-env.sh            # default: .venv-oneflow at the repository root
#   AUTOPAR_ONEFLOW_VENV=/path bash scripts/oneflow-env.sh
#   source <(bash scripts/oneflow-env.sh --print-env)   # LD_LIBRARY_PATH for this shell
#
# OneFlow 0.9.0 is the last release (CPython 3.7-3.10 wheels, ~1 GB, CUDA build)
# and needs numpy<2 and protobuf<4, which the solver's ortools cannot live with,
# hence a venv of its own (BRIEF section 6).  It runs on CPU with the cuDNN and
# cuBLAS wheels below on LD_LIBRARY_PATH; CUDA warnings at start are harmless.
# autopar is installed editable with --no-deps (its core needs only numpy and pydantic).
# Idempotent: an existing venv that imports oneflow is reused as it is.
# Writes $VENV/activate-oneflow (source it to get the venv and the library path).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${AUTOPAR_ONEFLOW_VENV:-.venv-oneflow}"
PYTHON="${AUTOPAR_ONEFLOW_PYTHON:-}"
PRINT_ENV=0
[ "${1:-}" = "--print-env" ] && PRINT_ENV=1

log() { [ "$PRINT_ENV" = 1 ] || echo "oneflow-env: $*" >&2; }

find_python310() {
  if [ -n "$PYTHON" ]; then echo "$PYTHON"; return; fi
  for candidate in python3.10 "$HOME/.pyenv/versions/3.10"*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  if command -v uv >/dev/null 2>&1; then
    uv python find 3.10 2>/dev/null && return
  fi
  echo "oneflow-env: no Python 3.10 found (OneFlow 0.9 has wheels for 3.7-3.10 only); set AUTOPAR_ONEFLOW_PYTHON" >&2
  exit 2
}

site_packages() { "$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])'; }

library_path() {
  local site
  site="$(site_packages)"
  echo "$site/nvidia/cudnn/lib:$site/nvidia/cublas/lib"
}

oneflow_ok() {
  [ -x "$VENV/bin/python" ] || return 1
  LD_LIBRARY_PATH="$(library_path):${LD_LIBRARY_PATH:-}" "$VENV/bin/python" -c \
    'import oneflow, numpy; assert oneflow.__version__.startswith("0.9"), oneflow.__version__; assert numpy.__version__ < "2"' \
    >/dev/null 2>&1
}

if oneflow_ok; then
  log "reusing $VENV ($("$VENV/bin/python" --version 2>&1))"
else
  if [ ! -x "$VENV/bin/python" ]; then
    py="$(find_python310)"
    log "creating $VENV with $py"
    "$py" -m venv "$VENV"
  fi
  log "installing oneflow 0.9.0 and its native libraries (about 2 GB on first run)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q \
    "oneflow==0.9.0" "numpy<2" "protobuf<4" \
    "nvidia-cudnn-cu11==8.5.0.96" "nvidia-cublas-cu11==11.10.3.66" \
    "pytest>=7" >&2
  oneflow_ok || { echo "oneflow-env: oneflow does not import in $VENV" >&2; exit 1; }
fi

# The core's dependencies besides numpy (pyproject.toml); pydantic 2 installs beside OneFlow 0.9.
if ! "$VENV/bin/python" -c 'import pydantic; assert int(pydantic.VERSION.split(".")[0]) >= 2' >/dev/null 2>&1; then
  log "installing pydantic 2"
  "$VENV/bin/python" -m pip install -q "pydantic>=2.6" >&2
fi

# Check from / so that the checkout on sys.path (python -c adds the cwd) cannot pass for an install;
# reinstall when the installed metadata lacks the `autopar` subcommands' entry points (or names
# them by the import names used before the outer packages became autopar_solver/...).
REPO="$(pwd)"
if ! (cd / && AUTOPAR_REPO="$REPO" "$VENV/bin/python" -c 'import autopar, os, pathlib, sys; from importlib.metadata import entry_points; sys.exit(0 if pathlib.Path(autopar.__file__).resolve().is_relative_to(pathlib.Path(os.environ["AUTOPAR_REPO"]).resolve()) and any(ep.value.startswith("autopar_service.") for ep in entry_points(group="autopar.commands", name="submit")) else 1)') >/dev/null 2>&1; then
  log "installing autopar (editable, --no-deps)"
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >&2
fi

LIBS="$(library_path)"
cat > "$VENV/activate-oneflow" <<EOF
# source this file: the OneFlow venv and the native libraries OneFlow 0.9 needs on CPU
source "$(cd "$VENV" && pwd)/bin/activate"
export LD_LIBRARY_PATH="$LIBS:\${LD_LIBRARY_PATH:-}"
EOF

if [ "$PRINT_ENV" = 1 ]; then
  echo "export LD_LIBRARY_PATH=\"$LIBS:\${LD_LIBRARY_PATH:-}\""
else
  log "ready: source $VENV/activate-oneflow   (or: export LD_LIBRARY_PATH=\"$LIBS:\$LD_LIBRARY_PATH\")"
fi
