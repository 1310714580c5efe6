#!/usr/bin/env bash
# Install Debian's chromium for the dashboard's browser tests (tests/dashboard/test_browser.py),
# only when it is missing. Playwright drives this system browser: never `playwright install`.
set -euo pipefail
if [ -x /usr/bin/chromium ] || [ -n "${ELR_CHROMIUM:-}" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[install_browser] no apt-get here: install chromium yourself and set ELR_CHROMIUM=/path/to/chromium" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "[install_browser] installing chromium (apt-get) for the dashboard tests"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq chromium >/dev/null
