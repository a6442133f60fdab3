"""The edit loop: a bounded agent editing a crate until `cargo test` is green.

    sandbox.py  bubblewrap (plain process where unavailable): every command the loop runs
    cargo.py    cargo with --message-format=json, turned into compact diagnostics for the model
    tools.py    the tools the model calls (read/edit/write/search/test/...), paths kept in the workspace
    loop.py     the loop: limits, best-state commits, loop detection, flakebot's own verdict

May import flakebot.llm, flakebot.config, flakebot.errors, flakebot.cargo.runner.
"""
