#!/usr/bin/env bash
# schemathesis (all checks, stateful links) against a locally started `autopar serve`
# (embedded cache, API key, 1 s solves).  Usage: EXAMPLES=25 bash tests/service/schemathesis_run.sh
# positive_data_acceptance is excluded: a schema-valid graph (say, a dangling tensor) is still
# an invalid graph (422), which JSON Schema cannot express.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=$(mktemp -d)
export AUTOPAR_API_KEYS=st-key AUTOPAR_CACHE_DIR=$WORK/cache AUTOPAR_LOCAL_WORKERS=1 \
  AUTOPAR_DEFAULT_TIME_LIMIT_S=1 AUTOPAR_MAX_TIME_LIMIT_S=2 AUTOPAR_MAX_DEVICES=8 \
  AUTOPAR_MAX_BODY_BYTES=262144 AUTOPAR_MAX_COMPRESSED_BODY_BYTES=262144 AUTOPAR_SOLVER_WORKERS=1
PORT=${PORT:-18731}
.venv/bin/python -m autopar.cli serve --port "$PORT" --log-level warning > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER; wait $SERVER; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/livez" >/dev/null && break; sleep 0.3; done
timeout 1200 .venv/bin/schemathesis run "http://127.0.0.1:$PORT/openapi.json" --checks all \
  --exclude-checks positive_data_acceptance --phases examples,coverage,fuzzing,stateful \
  --max-examples "${EXAMPLES:-25}" --request-timeout 75 -H "X-API-Key: st-key" --seed 1 --no-color "$@"
