"""cargo, as flakebot calls it.

    runner.py       Cargo: the command line and environment for a run (crate source, --offline, target dir)
    metadata.py     `cargo metadata` / `locate-project` / lock generation: where packages sit, what they build
    diagnostics.py  `cargo --message-format=json` in the sandbox turned into compact diagnostics for the model

May import flakebot.config, errors, sandbox.
"""
