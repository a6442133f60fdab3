"""Delivering a crafted tool to its caller.

    manifest.py  usage instructions built from facts (help text, real example outputs, tool schemas)
    helpparse.py clap --help text -> parameters (flags, options, positionals) -> JSON Schema
    schema.py    tool input schemas OpenAI strict mode takes as they are (closed, optional = nullable)
    catalog.py   crafted tools kept with their flake, manifest and a GC root, per version; one transaction per write
    catalogdb.py the catalog's index, catalog.db (SQLite): one row per tool, catalog.json moved in on first open
    definitions.py  each catalogued tool's MCP definition, cached against its version, manifest and the code
    versions.py  NAME@VERSION references and the version an improvement gets
    howto.py     what a catalogued thing is (tool or service) and the door to use it by, for a result's caller
    publish.py   nix copy of a catalogued tool's closure to a binary cache or another store, signed
    shared.py    a shared catalog in a binary cache: the entry as a store path, its files, the index (file://)
    index.py     a shared catalog's signed index: verified (signature, expiry) and validated before it is read
    seen.py      the highest index sequence and tool versions seen per shared catalog (rollbacks refused)
    install.py   a published tool fetched (nix copy), its signatures checked against configured keys, catalogued
    signatures.py  Nix signatures (ed25519 over a path's fingerprint, and over an index snapshot) in flakebot
    toolrun.py   a catalogued tool run for its caller, in the sandbox: what it may read, where it may write
    grants.py    the grant roots a tool's writable paths must lie beneath (an allow list; never configuration)
    writelayer.py  a tool's writable paths as staged copies, copied back as data only (no links, no config names)
    outputfiles.py outputs/: a tool call's stdout past tool_output_limit, under outputs_mb (oldest removed first)
    results.py   the results agents get, compact: what an agent acts on first, under a size budget

May import flakebot.nix, config, errors, fsutil, templates, sandbox.
"""
