#!/usr/bin/env bash
# Elastic depth on the ladder: SFT (loop-wise chain targets vs a final-answer-only baseline) ->
# held-out pass@1 per environment and k at D=1..3, two seeds; --rl adds profile -> GRPO
# (curriculum alpha 0.3 vs uniform k) and continued SFT. Uses the existing .venv (scripts/setup_env.sh).
# Usage: bash scripts/depth_demo.sh [RUN_DIR] [--seeds 0,1] [--steps 2000] [--tasks 256] [--difficulties 1,2,3] [--rl]
#        bash scripts/depth_demo.sh RUN_DIR2 --rl-from RUN_DIR --envs ladder_tail --difficulties 3   (RL stages only)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${ELR_VENV:-$ROOT/.venv}/bin/python" -m elr_rl.depth_demo "$@"
