#!/usr/bin/env bash
# Submit an RL run to a Ray cluster as a Ray job: the working directory travels with it.
#
#   RAY_ADDRESS=http://HEAD:8265 bash scripts/submit.sh configs/rl_dory4b.yaml [key=value ...]
#
# The job's driver runs `elr-rl rl CONFIG ... run.ray_address=auto` on the head node, so
# the learner and rollout actors are placed across the cluster's nodes (set
# learner.resources / rollout.resources to pin them to node types). Every node needs
# elr-rl installed (scripts/setup_env.sh); ELR_PYTHON names its interpreter.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: RAY_ADDRESS=http://HEAD:8265 bash scripts/submit.sh CONFIG [key=value ...]" >&2
  exit 2
fi
: "${RAY_ADDRESS:?set RAY_ADDRESS to the dashboard address of the cluster, e.g. http://127.0.0.1:8265}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ELR_PYTHON:-python}"
RAY="${ELR_RAY:-ray}"
cd "$ROOT"
# The job starts in a copy of the uploaded working directory that it owns: Ray may
# garbage-collect its unpacked working_dir while the long-running driver still sits in it.
exec "$RAY" job submit --address "$RAY_ADDRESS" \
  --runtime-env-json '{"working_dir": ".", "excludes": [".venv", "runs", ".git", "*.safetensors"]}' \
  -- bash -c 'set -e; d=$(mktemp -d "${TMPDIR:-/tmp}/elr-rl-job.XXXXXX"); cp -r . "$d"; cd "$d"; py="$1"; shift; exec "$py" -m elr_rl.cli rl "$@" run.ray_address=auto' \
  _ "$PY" "$@"
