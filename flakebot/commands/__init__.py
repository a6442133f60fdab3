"""The commands: one module per group of verbs (craft, improve, evaluating, runs, setup, catalog_tools, wrap (package),
share, service_verbs, token_verbs), each declaring its commands for the table (table.py: a function whose parameters
are the request, its docstring the help, its result plain data) with its checks before any work and its logic. The
CLI (flakebot.cli.generated), the MCP tools (flakebot.mcp.tooltable) and the Python API (flakebot.api) are made from
the table. May import: crates, deliver, evaluate (eval's harness, handed the craft function), llm, nix, pipeline,
services, source, stages, team (the work each command starts).
"""
