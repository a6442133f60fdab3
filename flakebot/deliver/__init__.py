"""Delivering a crafted tool to its caller.

    manifest.py  usage instructions built from facts (help text, real example outputs, tool schemas)
    helpparse.py clap --help text -> parameters (flags, options, positionals) -> JSON Schema
    schema.py    tool input schemas OpenAI strict mode takes as they are (closed, optional = nullable)
    catalog.py   crafted tools kept with their flake, manifest and a GC root, per version; atomic, locked writes
    versions.py  NAME@VERSION references and the version an improvement gets
    publish.py   nix copy of a catalogued tool's closure to a binary cache or another store, signed

May import flakebot.nix, config, errors, fsutil, templates, sandbox.
"""
