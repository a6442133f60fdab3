#!/usr/bin/env bash
# make demo: run the main job end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/flakebot --help
