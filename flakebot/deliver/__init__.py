"""Delivering a crafted tool to its caller.

    manifest.py  usage instructions built from facts (help text, real example outputs, tool schemas)
    helpparse.py clap --help text -> parameters (flags, options, positionals) -> JSON Schema
    catalog.py   crafted tools kept with their flake, manifest and a GC root; atomic, locked writes
    instruct.py  the pipeline's instruct stage

May import flakebot.nix, flakebot.config, flakebot.errors, flakebot.fsutil.
"""
