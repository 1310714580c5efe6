#!/usr/bin/env bash
# Create (or reuse) .venv-bench-trl: a separate venv with TRL for scripts/bench_trl.py.
#
# TRL is a benchmark-only dependency: it never goes into the project's .venv. The venv uses
# the same Python 3.11 as .venv and the CPU build of torch (pinned, so pip does not pull the
# CUDA wheels). Idempotent: a stamp file holds the hash of the requirements below, and the
# install is skipped when it matches.
#
#     bash scripts/setup_bench_trl.sh        # then: .venv-bench-trl/bin/python scripts/bench_trl.py
#
# Environment: BENCH_TRL_PYTHON (interpreter to build the venv from; default: the one behind
# .venv, else python3.11, else python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-bench-trl"
STAMP="$VENV/.bench-trl-requirements.sha256"

# Pinned versions, verified together on CPU (transformers is the one .venv uses).
REQUIREMENTS="torch==2.13.0+cpu
transformers==5.19.0
trl==1.16.0
datasets
accelerate
tokenizers"

say() { echo "[setup_bench_trl] $*"; }

pick_python() {
    if [[ -n "${BENCH_TRL_PYTHON:-}" ]]; then echo "$BENCH_TRL_PYTHON"; return; fi
    if [[ -x "$ROOT/.venv/bin/python" ]]; then
        readlink -f "$ROOT/.venv/bin/python"; return
    fi
    for p in python3.11 python3; do
        if command -v "$p" >/dev/null 2>&1; then command -v "$p"; return; fi
    done
    say "no Python interpreter found (set BENCH_TRL_PYTHON)" >&2
    exit 1
}

want="$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    say "up to date: $VENV ($("$VENV/bin/python" -c 'import trl; print("trl", trl.__version__)' 2>/dev/null || echo 'trl ?'))"
    exit 0
fi

PY="$(pick_python)"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV with $PY ($("$PY" -V 2>&1))"
    "$PY" -m venv "$VENV"
else
    say "reusing $VENV (requirements changed or last install incomplete)"
fi
rm -f "$STAMP"

REQ_FILE="$(mktemp)"
trap 'rm -f "$REQ_FILE"' EXIT
printf '%s\n' "$REQUIREMENTS" > "$REQ_FILE"
say "installing: $(tr '\n' ' ' < "$REQ_FILE")"
# The CPU torch wheel comes from PIP_FIND_LINKS when set (e.g. /opt/wheels), else from the
# PyTorch CPU index (BENCH_TRL_TORCH_INDEX); everything else from PyPI.
extra=()
if [[ -z "${PIP_FIND_LINKS:-}" ]]; then
    extra=(--extra-index-url "${BENCH_TRL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
fi
if ! "$VENV/bin/python" -m pip install --quiet "${extra[@]}" -r "$REQ_FILE"; then
    say "install failed (no network? see the pip output above)" >&2
    exit 1
fi
"$VENV/bin/python" -c 'import torch, transformers, trl; from trl import GRPOConfig, GRPOTrainer; print("[setup_bench_trl] ok: torch", torch.__version__, "transformers", transformers.__version__, "trl", trl.__version__)'
echo "$want" > "$STAMP"
