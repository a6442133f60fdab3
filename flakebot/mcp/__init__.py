"""The MCP door: flakebot as an MCP server over stdio, or over HTTP for a team; its tools made from the command table.

    server.py     the server: tools/list and tools/call (flakebot's own tools and every crafted one), jobs, stdio
    front.py      `flakebot serve`: the same server over Streamable HTTP, bearer tokens, admission and audit per
                  token (flakebot.team), the protected-resource metadata, loopback unless TLS and tokens
    gone.py       the front's session requests whose client went away, cancelled as its notifications/cancelled would
    queued.py     the front's crafts in the team queue (--database): a job handle `status` follows, tasks of
                  queued jobs, read from the job's row by any front, for its tenant only
    tasks.py      MCP tasks (protocol 2025-11-25): a long call answered at once with a task, followed by tasks/get
    start.py      `initialize` answered from a cache before the SDK imports (hosts give a server about a second)
    follow.py     a status that waits for the run to move on; a detached job's journal relayed as progress
    hints.py      MCP tool annotations: read-only, destructive, idempotent, open-world, per tool

May import: api, commands, deliver, pipeline, services, team, validation (the library it serves). Nothing in the library imports it;
the CLI's `flakebot mcp` starts it.
"""
