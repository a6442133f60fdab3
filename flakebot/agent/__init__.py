"""The edit loop: a bounded agent editing a crate until `cargo test` is green.

    tools.py       the tools the model calls (read/edit/write/search/test/add_dependency), paths kept in the
                   workspace; online, a changed manifest is fetched on the host before the next offline build
    loop.py        the loop: limits, best-state commits, loop detection
    verdict.py     flakebot's own verdict: `cargo test` in the sandbox, the frozen acceptance tests included
    acceptance.py  the acceptance tests written from the need, frozen before any edit

May import flakebot.llm, flakebot.config, flakebot.errors, flakebot.cargo, flakebot.sandbox.
"""
