"""What flakebot offers the agent programs that host it (MCP clients, the CLI's --json readers).

    heartbeat.py  a heartbeat event while a step is long, naming what the run waits on (events.waiting_on)
    hints.py      MCP tool annotations: read-only, destructive, idempotent, open-world, per tool
    results.py    long tools' results, compact: what an agent acts on first, under a size budget
    follow.py     a status that waits for the run to move on; a detached job's journal relayed as progress

May import: only the shared leaves (events, modeltext). The MCP server and the CLI import it.
"""
