#!/usr/bin/env bash
# make demo: craft "need a CSV deduper" end to end, then use the tool it made.
# With GROQ_API_KEY or OPENAI_API_KEY set, a real model does the work (crates.io when reachable).
# Without, a hand-written session is replayed through flakebot's local chat-completions stub server,
# so the whole real pipeline still runs offline: registry search, acquire, sandboxed cargo test
# loop, flake, nix build, nix run, manifest, cleanup.
set -euo pipefail
cd "$(dirname "$0")/.."
flakebot=.venv/bin/flakebot
need="need a CSV deduper"

if [ -n "${GROQ_API_KEY:-}" ] || [ -n "${OPENAI_API_KEY:-}" ]; then
  echo "demo: using your model ($($flakebot models --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["result"]["default"]["model"])'))"
  args=()
else
  echo "demo: no GROQ_API_KEY or OPENAI_API_KEY set: replaying the hand-written session"
  echo "      flakebot/data/sessions/csv-dedup.json through a local stub server (the real openai SDK talks to it)."
  echo "      Set a key to watch a real model craft the tool instead."
  args=(--model scripted:flakebot/data/sessions/csv-dedup.json --registry local --offline)
fi

echo
echo "\$ flakebot craft \"$need\" --fresh ${args[*]}"
$flakebot craft "$need" --fresh "${args[@]}"
echo
echo "\$ flakebot run csv-dedup -- --key name demo/people.csv      (its store path, in the sandbox)"
$flakebot run csv-dedup -- --key name demo/people.csv
echo
echo "\$ flakebot run csv-dedup -- demo/people.csv"
$flakebot run csv-dedup -- demo/people.csv

run_id=$($flakebot runs --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["result"]["runs"][0]["id"])')
echo
echo "Usage instructions for the calling agent: $($flakebot show csv-dedup --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["result"]["dir"])')/USAGE.md"
run_dir=$($flakebot show "$run_id" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["result"]["dir"])')
echo "Kept for audit in $run_dir: $(ls -A "$run_dir" | tr '\n' ' ')"
echo "(the workspace and the cargo target directory were removed by the clean stage)"
