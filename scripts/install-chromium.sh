#!/usr/bin/env bash
# Installs Debian's chromium (headless browser for kamera-browser) when /usr/bin/chromium is missing.
# Idempotent; needs root (or passwordless sudo). Non-interactive.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
"$(dirname "$0")/apt-install.sh" chromium fonts-dejavu-core
/usr/bin/chromium --version
