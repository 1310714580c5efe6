#!/usr/bin/env bash
# Debian packages the project uses beyond Python, installed only when missing:
#   chromium    the dashboard's browser tests (Playwright drives this system browser; never `playwright install`)
#   bubblewrap  the sandbox tier for model-written code (environments/sandbox.py: without it, scoring stops with an
#               error unless sandbox.allow_weaker_tier=true)
set -euo pipefail
need=()
[ -x /usr/bin/chromium ] || [ -n "${ELR_CHROMIUM:-}" ] || need+=(chromium)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[system-deps] no apt-get here: install ${need[*]} yourself (or set ELR_CHROMIUM=/path/to/chromium)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "[system-deps] installing ${need[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq "${need[@]}" >/dev/null
