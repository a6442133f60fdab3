"""The edit loop: a bounded agent editing a crate until flakebot's own verdict is green.

    loop.py        EditLoop: limits, best-state commits, loop detection; the model only proposes
    tools.py       the tools the model calls (read/edit/write/search/test/add_dependency), paths kept in the
                   workspace; online, a changed manifest is fetched on the host before the next offline build
    verdict.py     flakebot's verdict: `cargo test` in the sandbox, every acceptance example run and passed
    acceptance.py  the acceptance test written from the spec before any edit, frozen by hash
    workspace.py   Workspace: the tree the loop acts on (hardened git, frozen files, commit/restore, verdict inputs)

May import flakebot.cargo, config, errors, fsutil, llm (types), sandbox, source.safegit (host git), templates,
toolspec.
"""
