#!/usr/bin/env bash
# Set up the environment (if needed) and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/model -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# Two cores: keep torch from oversubscribing when engines run beside tests.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
exec "$ELR_VENV/bin/python" -m pytest --strict-markers -p no:cacheprovider --durations=20 "$@"
