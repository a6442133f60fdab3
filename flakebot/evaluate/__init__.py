"""Evaluation: run a suite of needs through real crafts and score the tools on held-out checks.

suite.py    the suite file (needs, their sessions, held-out checks) and its loader
fixtures.py sources a need starts from that must be made at run time (a cargo workspace in git)
checks.py   held-out checks run on the built tool in the sandbox
record.py   a live run's transcript as a replayable model script (--record)
harness.py  evaluate(): one craft per need, the scores, bench/eval.{md,json}

May import llm, pipeline, sandbox and source (safegit, for fixture repositories) (and the leaves), never commands: the
eval command (commands/evaluating.py) hands the harness the craft function; nothing imports it but that command.
"""
