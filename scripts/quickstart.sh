#!/usr/bin/env bash
# Set up the environment (if needed), then run the main job on tiny CPU defaults.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN="${1:-runs/quickstart}"
mkdir -p "$RUN"
echo "== 1/1 the looped model: greedy output and time per token at k = 1..4, save/load"
elr-rl model init "$RUN/init"
elr-rl model info "$RUN/init"
elr-rl model demo --checkpoint "$RUN/init"
