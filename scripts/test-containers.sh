#!/usr/bin/env bash
# End-to-end test of the container images and the compose stack, offline, with podman:
#
#   1. a local Debian base (docker/local-base.sh: debootstrap bookworm + python3,
#      python3-venv, redis-server; cached by a hash of its inputs) stands in for
#      python:3.11-slim and redis:7-alpine when no image registry is reachable;
#   2. wheels built on the host (pip wheel, cp311 like bookworm's python3) go into
#      docker/wheelhouse/ and the image is built from them with no network at all;
#   3. the image refuses to serve without AUTOPAR_API_KEYS, runs as non-root;
#   4. docker/compose.yaml (api, 2 workers, redis) comes up under podman-compose and
#      every container turns healthy;
#   5. plans for tiny-gpt and mt5-base go through the published port with
#      `autopar submit`; the second mt5-base submit must be a cache hit;
#   6. a worker killed with SIGKILL is restarted by its restart policy;
#   7. a job queued while Redis restarts is still there afterwards and completes;
#   8. everything is torn down (trap), and the timings are printed.
#
#   bash scripts/test-containers.sh
#
# Environment: AUTOPAR_PYTHON_IMAGE / AUTOPAR_REDIS_IMAGE use registry images instead
# of the local base; AUTOPAR_CONTAINERS_CACHE (default /var/cache/autopar-containers)
# holds the cached base rootfs and dependency wheels; AUTOPAR_MT5_TIME_LIMIT (20 s).
# Skips (exit 0) with a message only when podman cannot run at all.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

if ! command -v podman >/dev/null 2>&1; then
  echo "test-containers: SKIP: podman is not installed (apt-get install -y podman runc debootstrap podman-compose)"
  exit 0
fi
# crun (podman's default runtime) fails on hosts like this CI machine; see the file.
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/docker/podman-containers.conf}"
if ! podman info >/dev/null 2>&1; then
  echo "test-containers: SKIP: podman cannot run here: $(podman info 2>&1 | tail -1)"
  exit 0
fi
command -v podman-compose >/dev/null 2>&1 || die "podman-compose is not installed (apt-get install -y podman-compose)"

PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || die ".venv is missing: run bash scripts/setup.sh first"
AUTOPAR="$ROOT/.venv/bin/autopar"
CACHE="${AUTOPAR_CONTAINERS_CACHE:-/var/cache/autopar-containers}"
PROJECT=autopar-test
IMAGE=localhost/autopar:test
MT5_TIME_LIMIT="${AUTOPAR_MT5_TIME_LIMIT:-20}"
WORK="$(mktemp -d)"
COMPOSE=(podman-compose --no-ansi -p "$PROJECT" -f docker/compose.yaml)
declare -a TIMINGS=()
timing() { TIMINGS+=("$(printf '%-44s %s' "$1" "$2")"); log "$1: $2"; }

cleanup() {
  local rc=$?
  log "tearing down"
  "${COMPOSE[@]}" down -v >"$WORK/down.log" 2>&1 || { log "compose down failed:"; tail -5 "$WORK/down.log" >&2; }
  podman volume rm -f "${PROJECT}_redis-data" >/dev/null 2>&1 || true
  find docker/wheelhouse -name '*.whl' -delete 2>/dev/null || true
  podman image prune -f >/dev/null 2>&1 || true
  rm -rf "$WORK"
  if [ "$rc" -ne 0 ]; then log "test-containers: FAILED (exit $rc)"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t_all=$SECONDS

# ---------------------------------------------------------------- 1. base images
if [ -n "${AUTOPAR_PYTHON_IMAGE:-}" ]; then
  PYTHON_IMAGE="$AUTOPAR_PYTHON_IMAGE"
  REDIS_IMAGE="${AUTOPAR_REDIS_IMAGE:-redis:7-alpine}"
else
  t=$SECONDS
  PYTHON_IMAGE="$(AUTOPAR_CONTAINERS_CACHE="$CACHE" bash docker/local-base.sh)"
  REDIS_IMAGE="${AUTOPAR_REDIS_IMAGE:-$PYTHON_IMAGE}"
  timing "local base ($PYTHON_IMAGE)" "$((SECONDS - t)) s, $(podman image inspect --format '{{.Size}}' "$PYTHON_IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
fi
base_py="$(podman run --rm "$PYTHON_IMAGE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
  || die "cannot run python3 in $PYTHON_IMAGE"
log "base image python $base_py, redis image $REDIS_IMAGE"

# ---------------------------------------------------------------- 2. wheels, image
# Dependency wheels are cached per pyproject.toml and base Python; the autopar wheel is
# built fresh each run (SOURCE_DATE_EPOCH makes it byte-identical for identical
# sources, so podman's layer cache still hits).  The host's pip evaluates environment
# markers for the host's Python (3.11.7 here does not need async-timeout, bookworm's
# 3.11.2 does), so the base image's own pip resolves against the wheelhouse, offline,
# and whatever it misses is fetched on the host, until it resolves.
t=$SECONDS
host_py="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
base_full="$(podman run --rm "$PYTHON_IMAGE" python3 -c 'import platform; print(platform.python_version())')"
tag="cp${base_py/./}"
deps_key="$( { cat pyproject.toml; echo "$base_full"; } | sha256sum | cut -c1-16)"
deps="$CACHE/wheels-$tag-$deps_key"
plats=(--platform manylinux2014_x86_64)
for minor in $(seq 17 36); do plats+=(--platform "manylinux_2_${minor}_x86_64"); done
fetch_binary() {  # fetch_binary DIR REQ...: target wheels (cp, base Python, manylinux x86_64)
  local dir=$1; shift
  "$PY" -m pip download --only-binary=:all: --python-version "$base_full" --implementation cp \
    "${plats[@]}" --dest "$dir" "$@" >>"$WORK/pip.log" 2>&1 \
    || { grep -v '^WARNING: Location' "$WORK/pip.log" | tail -20 >&2; die "pip download $* failed"; }
}
resolve_in_base() {  # the base image's pip installs autopar[service] from DIR only (dry run)
  podman run --rm --network none -v "$1:/wheels:ro" "$PYTHON_IMAGE" sh -c \
    'python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --dry-run --no-index --find-links /wheels "autopar[service]"' 2>&1
}
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}"
find docker/wheelhouse -name '*.whl' -delete
# build from a clean copy: a stale build/ in the checkout could leak removed modules
mkdir "$WORK/src"
cp -r pyproject.toml README.md autopar solver cache service "$WORK/src/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip wheel --no-deps --wheel-dir docker/wheelhouse "$WORK/src" >>"$WORK/pip.log" 2>&1 \
  || { grep -v '^WARNING: Location' "$WORK/pip.log" | tail -20 >&2; die "pip wheel . failed"; }
if [ ! -d "$deps" ]; then
  mkdir -p "$CACHE"
  rm -rf "$deps.partial"
  if [ "$host_py" = "$base_py" ]; then
    "$PY" -m pip wheel --wheel-dir "$deps.partial" "$WORK/src[service]" >>"$WORK/pip.log" 2>&1 \
      || { grep -v '^WARNING: Location' "$WORK/pip.log" | tail -20 >&2; die "pip wheel .[service] failed"; }
  else
    fetch_binary "$deps.partial" "$WORK/src[service]"
  fi
  rm -f "$deps.partial"/autopar-*.whl
  cp docker/wheelhouse/autopar-*.whl "$deps.partial/"
  for _ in $(seq 10); do
    out="$(resolve_in_base "$deps.partial")" && break
    missing="$(sed -n 's/.*No matching distribution found for \([^;]*\).*/\1/p' <<<"$out" | head -1)"
    [ -n "$missing" ] || { echo "$out" >&2; die "the base image's pip cannot install from the wheelhouse"; }
    log "the base Python also needs $missing: fetching it on the host"
    fetch_binary "$deps.partial" --no-deps "$missing"
  done
  resolve_in_base "$deps.partial" >/dev/null || die "the wheelhouse does not resolve in the base image"
  rm -f "$deps.partial"/autopar-*.whl
  mv "$deps.partial" "$deps"
fi
cp "$deps"/*.whl docker/wheelhouse/
timing "wheels ($(ls docker/wheelhouse/*.whl | wc -l) for $tag, Python $base_full)" "$((SECONDS - t)) s"

t=$SECONDS
# --network none: the build fetches nothing; every wheel comes from docker/wheelhouse/.
# --format docker: OCI images drop HEALTHCHECK.
podman build -q --format docker --network none --ignorefile docker/Dockerfile.dockerignore \
  --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" -f docker/Dockerfile -t "$IMAGE" . >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; die "podman build failed"; }
timing "image build" "$((SECONDS - t)) s"
size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
timing "image size ($IMAGE)" "$(awk -v s="$size" 'BEGIN {printf "%.0f MB", s/1e6}')"

# ---------------------------------------------------------------- 3. image checks
uid="$(podman run --rm --no-healthcheck "$IMAGE" id -u)"
[ "$uid" != 0 ] || die "the image runs as root"
log "image runs as uid $uid"
set +e
refusal="$(podman run --rm --no-healthcheck -e AUTOPAR_API_KEYS= "$IMAGE" 2>&1)"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "no_api_keys" <<<"$refusal" \
  || die "the API started without AUTOPAR_API_KEYS (exit $rc): $refusal"
log "without a key the API refuses (exit $rc): $refusal"

# ---------------------------------------------------------------- 4. compose up
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
KEY="test-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
export AUTOPAR_IMAGE="$IMAGE" AUTOPAR_REDIS_IMAGE="$REDIS_IMAGE" AUTOPAR_PORT="$PORT" \
  AUTOPAR_API_KEYS="$KEY" AUTOPAR_ALLOW_ANONYMOUS=0
export AUTOPAR_API_KEY="$KEY"  # what `autopar submit` sends
SERVER="http://127.0.0.1:$PORT"
"${COMPOSE[@]}" down -v >/dev/null 2>&1 || true   # leftovers of an interrupted run

cname() { podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
            --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -1; }
healthy() { podman healthcheck run "$1" >/dev/null 2>&1; }
SERVICES=(redis api worker-1 worker-2)
wait_healthy() {  # wait_healthy LIMIT_S SERVICE...
  local limit=$1; shift
  local deadline=$((SECONDS + limit)) s c pending
  while :; do
    pending=()
    for s in "$@"; do
      c="$(cname "$s")"
      [ -n "$c" ] && healthy "$c" || pending+=("$s")
    done
    [ ${#pending[@]} -eq 0 ] && return 0
    if [ $SECONDS -ge $deadline ]; then
      log "not healthy after ${limit} s: ${pending[*]}"
      for s in "${pending[@]}"; do c="$(cname "$s")"; [ -n "$c" ] && podman logs --tail 20 "$c" >&2; done
      return 1
    fi
    sleep 1
  done
}

t=$SECONDS
"${COMPOSE[@]}" up -d >"$WORK/up.log" 2>&1 || { tail -30 "$WORK/up.log" >&2; die "podman-compose up failed"; }
wait_healthy 180 "${SERVICES[@]}" || die "the stack did not become healthy"
"$PY" - "$SERVER" <<'EOF' || die "the API is not ready"
import sys, time, urllib.request
deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(sys.argv[1] + "/readyz", timeout=3) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.5)
EOF
timing "compose up -> all 4 healthy, API ready" "$((SECONDS - t)) s"
podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}\t{{.Status}}\t{{.Ports}}' >&2
podman port "$(cname api)" | grep -qv '127.0.0.1' && die "the API is published beyond 127.0.0.1: $(podman port "$(cname api)")"

# ---------------------------------------------------------------- 5. submits
# A fixed mesh shape: without one the planner searches 3 shapes in parallel (slower).
SHAPE=(--cluster 2x4 --mesh-shape 4,2 --zero 2)
submit() {  # submit LABEL ARGS...: runs autopar submit, records its wall time
  local label=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$AUTOPAR" submit "$@" --server "$SERVER" --no-progress >"$WORK/out" 2>"$WORK/err" \
    || { cat "$WORK/err" "$WORK/out" >&2; die "autopar submit $* failed"; }
  t1=$(date +%s.%N)
  # the output's line "plan KEY in S s" (then "plan written to FILE")
  timing "$label" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f s", b - a}') ($(grep -E '^plan [0-9a-f]+ in ' "$WORK/out" \
    | tail -1 | awk '{printf "plan %s; %s s from request to plan", substr($2, 1, 12), $4}'))"
}
submit "submit tiny-gpt (miss, solved by a worker)" tiny-gpt "${SHAPE[@]}" --time-limit 10 --wait --out "$WORK/tiny.json"
grep -q "cached plan" "$WORK/err" && die "the first tiny-gpt submit was a cache hit: is the volume fresh?"
submit "submit mt5-base --time-limit $MT5_TIME_LIMIT (miss)" mt5-base "${SHAPE[@]}" --time-limit "$MT5_TIME_LIMIT" --wait --out "$WORK/mt5.json"
submit "submit mt5-base again (cache hit)" mt5-base "${SHAPE[@]}" --time-limit "$MT5_TIME_LIMIT" --wait --out "$WORK/mt5-again.json"
grep -q "cached plan" "$WORK/err" || { cat "$WORK/err" >&2; die "the second mt5-base submit was not a cache hit"; }
cmp -s "$WORK/mt5.json" "$WORK/mt5-again.json" || die "the cached mt5-base plan differs from the solved one"

# ---------------------------------------------------------------- 5b. table workers (opt-in)
# AUTOPAR_CONTAINERS_TABLE_BENCH=1: the cold cost tables of mt5-base on [2, 2, 2] built by
# the stack's own workers (benchmarks/table_workers.py --external, run in a container of the
# image on the compose network; Redis is not published), with 2 workers, then with
# worker-2 stopped.  Each row says how many workers were alive and whether the entries
# equal a serial build in the requesting container.
if [ "${AUTOPAR_CONTAINERS_TABLE_BENCH:-0}" = 1 ]; then
  network="$(podman inspect --format '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$(cname redis)" | awk '{print $1}')"
  bench() {  # bench LABEL: one --external run; rows go to the log and the timings
    podman run --rm --no-healthcheck --network "$network" -v "$ROOT/benchmarks:/bench/benchmarks:ro" \
      -w /bench -e PYTHONPATH=/bench "$IMAGE" python -m benchmarks.table_workers --external --skip-local \
      --redis-url redis://redis:6379/0 >"$WORK/bench.out" 2>"$WORK/bench.err" \
      || { cat "$WORK/bench.err" >&2; die "benchmarks.table_workers failed ($1)"; }
    cat "$WORK/bench.out" >&2
    timing "cost tables, $1" "$(tail -1 "$WORK/bench.out")"
  }
  bench "2 workers"
  podman stop -t 30 "$(cname worker-2)" >/dev/null
  sleep 12  # its liveness key expires (worker_alive_ttl_s, 10 s)
  bench "worker-2 stopped"
  podman start "$(cname worker-2)" >/dev/null
  wait_healthy 90 worker-2 || die "worker-2 did not come back after the table benchmark"
fi

# ---------------------------------------------------------------- 6. worker crash
w="$(cname worker-1)"
restarts0="$(podman inspect --format '{{.RestartCount}}' "$w")"
pid="$(podman inspect --format '{{.State.Pid}}' "$w")"
t=$SECONDS
kill -KILL "$pid"
log "SIGKILL to $w (pid $pid)"
deadline=$((SECONDS + 90))
until [ "$(podman inspect --format '{{.RestartCount}}' "$w")" -gt "$restarts0" ] \
      && [ "$(podman inspect --format '{{.State.Running}}' "$w")" = true ]; do
  [ $SECONDS -lt $deadline ] || die "$w was not restarted by its restart policy"
  sleep 1
done
wait_healthy 90 worker-1 || die "$w did not become healthy after its restart"
timing "worker SIGKILL -> restarted and healthy" "$((SECONDS - t)) s (restart count $(podman inspect --format '{{.RestartCount}}' "$w"))"

# ---------------------------------------------------------------- 7. redis restart
# Stop both workers so a new job stays queued in Redis, restart Redis, check the job
# is still there, then start the workers and let it finish.
podman stop -t 30 "$(cname worker-1)" "$(cname worker-2)" >/dev/null
"$AUTOPAR" submit tiny-gpt "${SHAPE[@]}" --time-limit 5 --memory 20GiB --server "$SERVER" >"$WORK/queued.json" 2>"$WORK/err" \
  || { cat "$WORK/err" >&2; die "submitting the job to keep queued failed"; }
job="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/queued.json")"
status="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$WORK/queued.json")"
[ "$status" = queued ] || die "job $job is $status, expected queued"
t=$SECONDS
podman restart -t 30 "$(cname redis)" >/dev/null
wait_healthy 60 redis || die "redis did not come back"
job_after="$("$PY" - "$SERVER" "$job" <<'EOF'
import json, os, sys, time, urllib.error, urllib.request
deadline = time.monotonic() + 60
while True:  # the API reconnects to the restarted Redis
    try:
        # reads need the key too when keys are configured (issue 10)
        req = urllib.request.Request(
            f"{sys.argv[1]}/v1/jobs/{sys.argv[2]}", headers={"X-API-Key": os.environ["AUTOPAR_API_KEY"]}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            print(json.load(r)["status"])
            break
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            print("lost")
            break
        if exc.code in (401, 403):
            print(f"refused ({exc.code})")
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        print("unreachable")
        break
    time.sleep(0.5)
EOF
)"
[ "$job_after" = queued ] || die "job $job after the Redis restart: $job_after (expected queued)"
podman start "$(cname worker-1)" "$(cname worker-2)" >/dev/null
wait_healthy 90 worker-1 worker-2 || die "the workers did not come back after the Redis restart"
submit "queued job after redis restart (finished)" tiny-gpt "${SHAPE[@]}" --time-limit 5 --memory 20GiB --wait --out "$WORK/queued-plan.json"
grep -q "$job" "$WORK/out" || die "the job that finished is not $job"
timing "redis restart -> queued job kept and solved" "$((SECONDS - t)) s"
wait_healthy 30 "${SERVICES[@]}" || die "the stack is not healthy at the end"

timing "total" "$((SECONDS - t_all)) s"
echo
echo "test-containers: PASS"
printf '  %s\n' "${TIMINGS[@]}"
