#!/usr/bin/env bash
# Copy a confirmatory study's records from the checkout that runs it (a git worktree at a fixed commit, so that
# edits to the code cannot change the runs) into this checkout's docs/results/study, and rewrite the report from
# them with this checkout's kpo (the analysis reads the records alone; the runner's own report is written with its
# frozen code, and only at each look). It trains nothing and never touches plan.json: the plan was committed
# before the first run, and a plan that differs between the two checkouts is an error.
#
#   scripts/update_study.sh SRC [DEST]    # SRC: the running checkout's study folder; DEST: docs/results/study
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:?give the folder of the running study, e.g. ../study-runner/docs/results/study}"
DEST="${2:-docs/results/study}"
cmp -s "$SRC/plan.json" "$DEST/plan.json" || { echo "update_study: $SRC/plan.json differs from $DEST/plan.json" >&2; exit 2; }
for f in seeds.json runs.json; do
    [ -e "$SRC/$f" ] && cp "$SRC/$f" "$DEST/$f.partial" && mv "$DEST/$f.partial" "$DEST/$f"
done
.venv/bin/kpo compare study --report --study "$DEST"
runs=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["runs"])' "$DEST/report.json")
.venv/bin/python scripts/readme_verdict.py
echo "update_study: $DEST holds $runs recorded runs of $SRC (the README's verdict table rewritten from its report.json)"
