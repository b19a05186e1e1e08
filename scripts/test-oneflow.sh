#!/usr/bin/env bash
# Run the OneFlow integration tests (marked `oneflow`) in .venv-oneflow
# (create it first with scripts/oneflow-env.sh): all of tests/oneflow, or the files and
# node ids given (scripts/test-oneflow.sh tests/oneflow/test_pipeline_apply.py).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AUTOPAR_ONEFLOW_VENV:-.venv-oneflow}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "no OneFlow venv at $VENV: run scripts/oneflow-env.sh first" >&2
  exit 2
fi
SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
export LD_LIBRARY_PATH="$SITE/nvidia/cudnn/lib:$SITE/nvidia/cublas/lib:${LD_LIBRARY_PATH:-}"
# test files or node ids given: those only; else the whole of tests/oneflow
paths=(tests/oneflow)
for arg in "$@"; do
  [ -e "${arg%%::*}" ] && paths=()  # a file, folder or node id (not an option's value)
done
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m oneflow "${paths[@]}" "$@"
