"""One module per command (craft, improve, evaluating, packaging, runs, catalog_tools, share, setup, services): its
checks before any work, its use-case logic and its result. flakebot.api re-exports them as the Python API; the CLI
and the MCP server call them through it. May import: crates, deliver, evaluate (eval's harness, handed the craft
function), llm, nix, pipeline, services (craft --service's starting point), source, stages (the work each command
starts).
"""
