#!/usr/bin/env bash
# Submit an RL run to a Ray cluster as a Ray job: the working directory travels with it.
#
#   RAY_ADDRESS=http://HEAD:8265 bash scripts/submit.sh configs/rl_dory4b.yaml run.output_dir=/shared/runs/x [key=value ...]
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
# The run folder must be an absolute path on storage every node mounts: the driver runs in a temporary copy
# of this folder on the head node, the learner ranks and workers in their own, so a relative one would
# scatter the checkpoints over temporary folders (the driver checks at start that every actor sees it).
out_dir="$("$PY" - "$@" <<'PYEOF'
import sys
import yaml
cfg = yaml.safe_load(open(sys.argv[1])) or {}
out = (cfg.get("run") or {}).get("output_dir", "runs/rl-tiny")
for arg in sys.argv[2:]:
    if arg.startswith("run.output_dir="):
        out = arg.split("=", 1)[1]
print(out)
PYEOF
)"
case "$out_dir" in
  /*) ;;
  *) echo "submit.sh: run.output_dir=$out_dir is relative; pass an absolute path on storage every node mounts," \
          "e.g. run.output_dir=/shared/runs/$(basename "$out_dir")" >&2
     exit 2 ;;
esac
# The job starts in a copy of the uploaded working directory that it owns: Ray may
# garbage-collect its unpacked working_dir while the long-running driver still sits in it.
exec "$RAY" job submit --address "$RAY_ADDRESS" \
  --runtime-env-json '{"working_dir": ".", "excludes": [".venv", "runs", ".git", "*.safetensors"]}' \
  -- bash -c 'set -e; d=$(mktemp -d "${TMPDIR:-/tmp}/elr-rl-job.XXXXXX"); cp -r . "$d"; cd "$d"; py="$1"; shift; exec "$py" -m elr_rl.cli rl "$@" run.ray_address=auto' \
  _ "$PY" "$@"
