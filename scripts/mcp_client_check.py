#!/usr/bin/env python3
"""Drives an MCP server through a list of tool calls with the official MCP Python SDK's client
(pip `mcp`, installed by scripts/mcp-venv.sh), over stdio or streamable HTTP, and prints what
came back as one JSON object on stdout. The `kamera mcp` test (crates/kamera-cli/tests/mcp.rs)
writes the calls and checks the answers.

usage: mcp_client_check.py CALLS.json --http URL
       mcp_client_check.py CALLS.json -- COMMAND [ARG...]      (the server, started on stdio)

CALLS.json: [{"tool": "navigate", "arguments": {"url": "..."}}, ...]
Output: {"tools": [names], "calls": [{"tool", "is_error", "text", "images": [{"mime_type",
"bytes", "png"}], "structured"}]}; a call that fails at the protocol level (not a tool error)
ends the run with exit status 1 and the error on stderr.
"""

import asyncio
import base64
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

# Model calls on a 2-core CPU and a whole scenario run can take minutes.
READ_TIMEOUT_S = 900


def content_of(result):
    """A tool result as plain JSON: its text, its images (checked to be PNGs), its structure."""
    texts, images = [], []
    for block in result.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "image":
            data = base64.b64decode(block.data)
            images.append(
                {
                    "mime_type": block.mime_type,
                    "bytes": len(data),
                    "png": data[:8] == b"\x89PNG\r\n\x1a\n",
                }
            )
    return {
        "is_error": bool(result.is_error),
        "text": "\n".join(texts),
        "images": images,
        "structured": result.structured_content,
    }


async def drive(read, write, calls):
    async with ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as session:
        await session.initialize()
        tools = await session.list_tools()
        out = {"tools": sorted(t.name for t in tools.tools), "calls": []}
        for call in calls:
            result = await session.call_tool(call["tool"], call.get("arguments", {}))
            out["calls"].append({"tool": call["tool"], **content_of(result)})
            print(f"mcp_client_check: {call['tool']}: error={result.is_error}", file=sys.stderr)
        return out


async def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        calls = json.load(f)
    if argv[2] == "--http" and len(argv) == 4:
        async with streamable_http_client(argv[3]) as (read, write):
            out = await drive(read, write, calls)
    elif argv[2] == "--" and len(argv) > 3:
        params = StdioServerParameters(command=argv[3], args=argv[4:])
        async with stdio_client(params) as (read, write):
            out = await drive(read, write, calls)
    else:
        sys.exit(__doc__)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    asyncio.run(main(sys.argv))
