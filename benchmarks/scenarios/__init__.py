"""Scenarios the reliability report runs and the tests reuse: sandbox escape attempts, hostile model sessions, a
small tool to craft (shout), a local crates.io as flakebot's online world, git served on loopback, and a second
machine for shared catalogs, Nix remote builders (builders.py) and a temporary PostgreSQL (postgres.py).

May import flakebot; never tests/ (the tests import these).
"""
