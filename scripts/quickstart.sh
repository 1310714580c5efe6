#!/usr/bin/env bash
# Set up the environment (if needed), then run the main job on tiny CPU defaults.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# bash scripts/quickstart.sh [RUN_DIR] [--seed N]   (default runs/quickstart, seed 0)
# pretrain -> SFT -> SFT calibration -> profile -> eval -> RL -> eval, each stage the user-facing `elr-rl` command.
exec "$ELR_VENV/bin/python" -m elr_rl.quickstart "$@"
