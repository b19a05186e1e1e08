#!/usr/bin/env bash
# Re-measure the figures of README.md, benchmarks/README.md and docs/explorer.md in one run:
# each section runs the command written next to its figures, one after the other, and
# writes what it printed to $OUT/<section>.txt (headed by the UTC time and the command).
#
#   bash scripts/measure.sh                 # every section (about 10-15 min on 2 cores, idle)
#   bash scripts/measure.sh warm plan-memo  # only those sections
#   bash scripts/measure.sh --list          # the sections
#   bash scripts/measure.sh screenshots     # docs/img from section report's page (not in the default run)
#
# Timing figures need an idle machine: run nothing else meanwhile.  The sections on the
# imported OneFlow MT5 job need /tmp/of-mt5 (and /tmp/of-mt5-fkv); section `of-mt5`
# builds them with the OneFlow venv (minutes; `bash scripts/oneflow-env.sh` first) when
# they are missing; of-eval re-imports them first, so later sections read this code's import.  OUT defaults to /tmp/measure.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/measure}
PY=.venv/bin/python
AUTOPAR=.venv/bin/autopar
IMPORTED=/tmp/of-mt5
PORT=${AUTOPAR_ONEFLOW_PORT:-29500}  # rank 0's port of this run's OneFlow launches
IMPORTED_FKV=/tmp/of-mt5-fkv
MT5="$OUT/mt5.json"
PLAN_ARGS=(--cluster 2x4 --preset a100-40g --mesh-shape 4,2 --memory 40GiB --time-limit 30 --no-progress)

SECTIONS=(of-mt5 of-eval of-eval-fkv baselines model-truth model-truth-fkv seed-replay cost-tables
  solver-10 solver-30 solver-50k-60 warm plan-memo plan-zero iteration auto-10s checkpointing-auto
  iteration-fidelity heldout-truth scale scoreboard scale-suite scale-40-layers pipeline-suite efficiency table-workers table-workers-compose promise problem-size report service service-429)

# run SECTION COMMAND...: the command, its output to $OUT/SECTION.txt and to the terminal
run() {
  local name=$1
  shift
  {
    echo "# $(date -u '+%Y-%m-%d %H:%M:%S') UTC, load average $(cut -d' ' -f1 /proc/loadavg)"
    local arg shown="\$"
    for arg in "$@"; do  # quote only what needs it, so the line can be pasted back
      if [[ $arg =~ [[:space:]\'\"\$] ]]; then shown+=" \"${arg//\"/\\\"}\""; else shown+=" $arg"; fi
    done
    echo "$shown"
  } | tee "$OUT/$name.txt"
  "$@" 2>&1 | tee -a "$OUT/$name.txt"
}

# timed SECTION COMMAND...: as run, with wall time and max RSS from /usr/bin/time
timed() {
  local name=$1
  shift
  run "$name" /usr/bin/time -f "%e s wall, max RSS %M kB" "$@"
}

oneflow() {  # a command in the OneFlow venv, autopar's side in the main one
  if [ ! -f .venv-oneflow/activate-oneflow ]; then
    echo "measure: no OneFlow venv here: run bash scripts/oneflow-env.sh first" >&2
    return 2
  fi
  # shellcheck disable=SC1091
  (source .venv-oneflow/activate-oneflow && AUTOPAR_PYTHON=.venv/bin/python "$@")
}

section() {
  case $1 in
    of-mt5)
      [ -f "$IMPORTED/result.json" ] || oneflow python benchmarks/oneflow_mt5.py \
        --out "$IMPORTED" --vocab 32128 --variants inference --time-limit 30 --master-port "$PORT"
      [ -f "$IMPORTED_FKV/result.json" ] || oneflow python benchmarks/oneflow_mt5.py \
        --out "$IMPORTED_FKV" --vocab 32128 --variants inference --time-limit 30 \
        --fused-cross-kv --master-port 29612
      ;;
    baselines) run baselines $PY -m benchmarks.baselines ;;
    model-truth) run model-truth $PY -m benchmarks.model_truth --imported "$IMPORTED" ;;
    model-truth-fkv) run model-truth-fkv $PY -m benchmarks.model_truth --imported "$IMPORTED_FKV" ;;
    seed-replay) run seed-replay $PY -m benchmarks.seed_replay ;;  # issues 22 and 26: the LiBai MT5 report
    of-eval)
      run of-eval oneflow python benchmarks/oneflow_mt5.py evaluate --out "$IMPORTED" \
        --vocab 32128 --variants inference --time-limit 30
      ;;
    of-eval-fkv)
      run of-eval-fkv oneflow python benchmarks/oneflow_mt5.py evaluate --out "$IMPORTED_FKV" \
        --vocab 32128 --variants inference --time-limit 30 --fused-cross-kv
      ;;
    cost-tables) run cost-tables $PY -m benchmarks.cost_tables ;;
    solver-10)
      run solver-10 $PY -m benchmarks.solver --time-limit 10 \
        --cases mt5-base-4x2,mt5-base-2x4,oneflow-mt5-imported --imported "$IMPORTED"
      ;;
    solver-30) run solver-30 $PY -m benchmarks.solver --time-limit 30 --imported "$IMPORTED" ;;
    solver-50k-60) run solver-50k-60 $PY -m benchmarks.solver --time-limit 60 --cases gpt-50k-ops ;;
    warm) run warm $PY -m benchmarks.solver --warm --time-limit 10 --imported "$IMPORTED" ;;
    plan-memo)
      rm -rf "$OUT/memo"
      timed plan-memo-cold $AUTOPAR plan "$MT5" "${PLAN_ARGS[@]}" --zero 2 --memo "$OUT/memo" --out "$OUT/p1.json"
      timed plan-memo-warm $AUTOPAR plan "$MT5" "${PLAN_ARGS[@]}" --zero 2 --memo "$OUT/memo" --out "$OUT/p2.json"
      ;;
    plan-zero)
      timed plan-zero2 $AUTOPAR plan "$MT5" "${PLAN_ARGS[@]}" --zero 2 --out "$OUT/plan-zero2.json"
      timed plan-zero3 $AUTOPAR plan "$MT5" "${PLAN_ARGS[@]}" --zero 3 --out "$OUT/plan-zero3.json"
      ;;
    iteration)  # issue 22: the plan for K micro-batches per step beside the baselines at the same K
      for ckpt in off auto full; do
        for k in 1 8 32; do
          timed "iteration-k$k-$ckpt" $AUTOPAR plan "$MT5" "${PLAN_ARGS[@]}" --zero 2 --micro-batches "$k" \
            --checkpointing "$ckpt" --compare --out "$OUT/plan-k$k-$ckpt.json"
        done
        for k in 8 32; do  # the K = 1 plan re-evaluated at the real K: what solving for K gains
          run "iteration-k1-at-k$k-$ckpt" $AUTOPAR evaluate "$MT5" "$OUT/plan-k1-$ckpt.json" --micro-batches "$k"
        done
      done
      ;;
    auto-10s)  # issue 22's acceptance: the seed's K = 8 with auto, cold, 10 s limit
      timed auto-10s $AUTOPAR plan "$MT5" --cluster 2x4 --preset a100-40g --mesh-shape 4,2 --memory 40GiB \
        --zero 2 --micro-batches 8 --checkpointing auto --time-limit 10 --no-progress --out "$OUT/plan-auto-10s.json"
      ;;
    checkpointing-auto)  # issue 22: a budget only recomputation meets (off: refused with its floor)
      for ckpt in off auto full; do
        timed "checkpointing-$ckpt-13.5g" $AUTOPAR plan gpt-1.3b --cluster 2x4 --preset a100-40g \
          --mesh-shape 4,2 --memory 13.5GiB --zero 2 --micro-batches 8 --checkpointing "$ckpt" \
          --time-limit 120 --no-progress --out "$OUT/gpt-1.3b-$ckpt.json" || true
      done
      ;;
    iteration-fidelity)  # issue 22: K = 4 and recomputation applied by OneFlow, bytes by phase
      mkdir -p "$OUT/iter"
      oneflow python -m oneflow.distributed.launch --nproc_per_node 4 --master_port "$PORT" \
        tests/oneflow/_build_iteration.py "$OUT/iter" all >"$OUT/iter-build.log" 2>&1
      for m in gpt-tiny mt5-tiny; do
        run "iteration-fidelity-$m-full" oneflow python -m autopar.cli oneflow fidelity "$OUT/iter/${m}_full.pb" \
          "$OUT/iter/${m}_full_plan.json" --graph "$OUT/iter/${m}_graph.json"
      done
      run iteration-fidelity-gpt-tiny-subset oneflow python -m autopar.cli oneflow fidelity \
        "$OUT/iter/gpt-tiny_subset.pb" "$OUT/iter/gpt-tiny_off_plan.json" --graph "$OUT/iter/gpt-tiny_graph.json" \
        --recompute model.h.0
      run iteration-fidelity-mt5-tiny-subset oneflow python -m autopar.cli oneflow fidelity \
        "$OUT/iter/mt5-tiny_subset.pb" "$OUT/iter/mt5-tiny_off_plan.json" --graph "$OUT/iter/mt5-tiny_graph.json" \
        --recompute model.encoder.block.0
      ;;
    heldout-truth)  # issue 26: development and evaluation jobs side by side
      mkdir -p "$OUT/heldout"
      oneflow python -m oneflow.distributed.launch --nproc_per_node 8 --master_port "$PORT" \
        tests/oneflow/_build_heldout_families.py "$OUT/heldout" --compile llama bert vit mt5-tiny gpt-tiny bert-tiny \
        >"$OUT/heldout-build.log" 2>&1
      oneflow python -m oneflow.distributed.launch --nproc_per_node 8 --master_port "$PORT" \
        tests/oneflow/_build_heldout.py "$OUT/heldout" build hf-t5-tiny hf-gpt2-tiny >>"$OUT/heldout-build.log" 2>&1
      run heldout-truth oneflow python -m benchmarks.heldout_truth "$OUT/heldout"
      # autopar's plans of the same jobs pinned and compiled by OneFlow
      oneflow python -m benchmarks.heldout_pinned plan "$OUT/heldout" >"$OUT/heldout-plan.log" 2>&1
      oneflow python -m oneflow.distributed.launch --nproc_per_node 8 --master_port "$PORT" \
        tests/oneflow/_pin_families.py "$OUT/heldout" >"$OUT/heldout-pin.log" 2>&1
      run heldout-pinned oneflow python -m benchmarks.heldout_pinned table "$OUT/heldout"
      ;;
    scale)  # issue 25: three-axis meshes and the mesh searches at 30 s; the 4x8 search and the 100k-op graph at 60 s
      run scale $PY -m benchmarks.solver --scale \
        --cases mt5-base-2,2,2,mt5-base-4,2,4,mt5-base-2,2,8,mt5-base-search-2x4,mt5-base-search-4x8
      run scale-60 $PY -m benchmarks.solver --scale --time-limit 60 --cases mt5-base-search-4x8,gpt-100k-ops-4x8-80g
      ;;
    scale-suite)  # issue 33: GPT-3 sizes on 4x8-32x8 against Megatron-LM at its best configuration
      run scale-suite $PY -m benchmarks.scale_suite --time-limit 90 ;;
    scale-40-layers)  # issue 33's repro: the 40-layer GPT on 32x8, the search cold and warm beside [32, 8] alone
      run scale-40-layers-model $AUTOPAR model gpt-1.3b --layers 40 --hidden 6144 --heads 48 --ffn 24576 \
        --vocab 51200 --seq 2048 --batch 128 --out "$OUT/gpt40.json"
      rm -rf "$OUT/memo-40"
      local args=(--cluster 32x8 --preset a100-80g --memory 80GiB --zero 2 --micro-batches 8 --checkpointing auto
        --time-limit 90 --no-progress)
      timed scale-40-layers-cold $AUTOPAR plan "$OUT/gpt40.json" "${args[@]}" --memo "$OUT/memo-40" --out "$OUT/gpt40-cold.json"
      timed scale-40-layers-warm $AUTOPAR plan "$OUT/gpt40.json" "${args[@]}" --memo "$OUT/memo-40" --out "$OUT/gpt40-warm.json"
      timed scale-40-layers-32x8 $AUTOPAR plan "$OUT/gpt40.json" "${args[@]}" --mesh-shape 32,8 --out "$OUT/gpt40-32x8.json"
      ;;
    scoreboard)  # issue 42: autopar's defaults against Megatron-LM's best, both as Megatron-LM runs them
      run scoreboard $PY -m benchmarks.scoreboard --time-limit 300 --json "$OUT/scoreboard.json" \
        --keep "$OUT/scoreboard" ;;
    pipeline-suite)  # issue 36: pipeline stages against Megatron-LM's best PTD-P (39.1B, 13B, 175B, issue 33's 18.4B)
      run pipeline-suite $PY -m benchmarks.pipeline_suite --time-limit 120 ;;
    efficiency) run efficiency $PY -m benchmarks.efficiency_check ;;  # issue 33: the compute model vs Megatron-LM's runs
    table-workers) run table-workers $PY -m benchmarks.table_workers ;;
    table-workers-compose)  # the same tables built by the compose stack's workers (podman): 2, then 1
      run table-workers-compose bash -c 'AUTOPAR_CONTAINERS_TABLE_BENCH=1 bash scripts/test-containers.sh 2>&1 \
        | grep -E "^(mt5-base on|\{)|^test-containers: "'
      ;;
    promise) run promise $PY -m benchmarks.solver --promise ;;
    problem-size)
      run problem-size $PY -m benchmarks.problem_size --model mt5-base --mesh-shapes 8 4,2 2,4 2,2,2
      ;;
    report)
      # docs/explorer.md: the plan solved as written there, the report, and the evaluator's totals
      timed report-plan $AUTOPAR plan "$MT5" --cluster 2x4 --mesh-shape 4,2 --zero 2 --time-limit 30 \
        --no-progress --out "$OUT/plan.json"
      timed report $AUTOPAR report "$MT5" "$OUT/plan.json" --compare megatron inferred --label autopar \
        --out "$OUT/mt5-base-report.html"
      stat -c '%s bytes' "$OUT/mt5-base-report.html" | tee -a "$OUT/report.txt"
      run evaluate $AUTOPAR evaluate "$MT5" "$OUT/plan.json"
      ;;
    screenshots)
      # docs/img: the report of section `report` as a browser shows it (needs chromium)
      $PY -m tests.report.screenshot "$OUT/mt5-base-report.html" docs/img/report-mt5-base.png --height 2600
      $PY -m tests.report.screenshot "$OUT/mt5-base-report.html" docs/img/report-mt5-base-memory.png \
        --height 1500 --anchor memory
      ;;
    service) run service $PY -m benchmarks.service --skip-cold --hits 200 --out "$OUT/service.json" ;;
    service-429) run service-429 $PY -m benchmarks.service --only-429 ;;
    *)
      echo "measure: unknown section $1 (one of: ${SECTIONS[*]})" >&2
      exit 2
      ;;
  esac
}

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${SECTIONS[@]}"
  exit 0
fi
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${SECTIONS[@]}")
for name in "${wanted[@]}"; do  # every name known before anything runs
  [[ " ${SECTIONS[*]} screenshots " == *" $name "* ]] || {
    echo "measure: unknown section $name (one of: ${SECTIONS[*]} screenshots)" >&2
    exit 2
  }
done
mkdir -p "$OUT"
[ -f "$MT5" ] || $AUTOPAR model mt5-base --out "$MT5"
for name in "${wanted[@]}"; do
  section "$name"
done
echo "measure: done, $(date -u '+%H:%M:%S') UTC; outputs in $OUT"
