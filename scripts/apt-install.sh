#!/usr/bin/env bash
# apt-install.sh PACKAGE... : installs Debian packages non-interactively (sudo when not root).
# The install-*.sh scripts call it after checking what is missing.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "$@"
