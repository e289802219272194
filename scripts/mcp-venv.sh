#!/usr/bin/env bash
# The official MCP Python SDK (pip package `mcp`, pinned) in a venv, installed once and cached:
# ${KAMERA_MCP_VENV:-~/.cache/kamera/venv-mcp}. The `kamera mcp` test drives the server with its
# client (scripts/mcp_client_check.py). Idempotent: a venv whose package imports at the pinned
# version is reused. Prints the venv's python on stdout.
set -euo pipefail
VERSION=${KAMERA_MCP_VERSION:-2.3.0}
VENV=${KAMERA_MCP_VENV:-$HOME/.cache/kamera/venv-mcp}
check() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; import mcp; sys.exit(m.version('mcp') != '$VERSION')" 2>/dev/null; }
if [ -x "$VENV/bin/python" ] && check; then
  echo "$VENV/bin/python"; exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q "mcp==$VERSION" >&2
check || { echo "mcp-venv: mcp==$VERSION did not install into $VENV" >&2; exit 1; }
echo "$VENV/bin/python"
