"""cargo, as flakebot calls it.

    runner.py       Cargo: the command line and environment for a run (crate source, --offline, target dir);
                    trusted host calls (neutral cwd, --manifest-path, minimal env, flakebot's CARGO_HOME)
    sources.py      which sources host calls may reach (crates.io, allowed git hosts, paths in the tree)
    fetch.py        the host-side fetch (generate-lockfile, fetch) before offline builds; the run's git view;
                    ManifestWatch
    metacache.py    one `cargo metadata` per workspace state: answers kept under a digest of what cargo reads
    metadata.py     `cargo metadata` / `locate-project` / lock generation: where packages sit, what they build
    diagnostics.py  `cargo --message-format=json` in the sandbox turned into compact diagnostics for the model
    cache_skeleton.py  the cache's skeleton crate: manifest and lock with empty targets, registry dependencies only
    depcache.py     the dependency cache: skeletons built once in the sandbox, copied into each edit loop's target dir

May import flakebot.config, errors, sandbox.
"""
