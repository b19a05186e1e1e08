#!/usr/bin/env bash
# The README's test command: set up .venv (idempotent) and run the test suite
# (everything but the OneFlow tests, which scripts/test-oneflow.sh runs, and the slow
# end-to-end ones: add -m 'not oneflow' to run those too, as .ci/run does); warnings are errors.
# Two pytest-xdist workers, one test file each at a time (--dist loadfile: a module's fixtures,
# solved problems among them, are built once): many tests wait on servers, workers and
# subprocesses, so two workers on 2 cores finish in about 3/4 of the time of one (README,
# Tests).  Arguments come after these: -n 0 runs in this process (e.g. for --pdb).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile "$@"
