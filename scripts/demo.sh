#!/usr/bin/env bash
# The README's main job: set up .venv, start the planning service with the embedded
# cache (no Redis), submit the bundled mt5-base graph for a 2x4 A100 cluster, print the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
exec .venv/bin/autopar submit mt5-base --serve --cluster 2x4 --preset a100-40g --mesh-shape 4,2 \
  --memory 40GiB --zero 2 --time-limit 30 --wait --out out/mt5-base.plan.json
