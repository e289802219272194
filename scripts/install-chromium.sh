#!/usr/bin/env bash
# Installs Debian's chromium (headless browser for kamera-browser) when /usr/bin/chromium is missing.
# Idempotent; needs root (or passwordless sudo). Non-interactive.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
