#!/usr/bin/env bash
# Installs Debian's redis-server (with redis-cli, from redis-tools) for kamera-store's Redis tests
# when redis-server is missing. Idempotent; needs root (or passwordless sudo). Non-interactive.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/apt-install.sh" redis-server redis-tools
redis-server --version
