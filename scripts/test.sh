#!/usr/bin/env bash
# The README's test command: set up .venv (idempotent) and run the test suite
# (everything but the OneFlow tests, which scripts/test-oneflow.sh runs, and the slow
# end-to-end ones: add -m 'not oneflow' to run those too, as .ci/run does); warnings are errors.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
