#!/usr/bin/env bash
# Copy a confirmatory study's records and report from the checkout that runs it (a git worktree at a fixed commit,
# so that edits to the code cannot change the runs) into this checkout's docs/results/study, to commit. It trains
# nothing and never touches plan.json: the plan was committed before the first run, and a plan that differs
# between the two checkouts is an error.
#
#   scripts/update_study.sh SRC [DEST]    # SRC: the running checkout's study folder; DEST: docs/results/study
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:?give the running study's folder, e.g. /work/study-wt/docs/results/study}"
DEST="${2:-docs/results/study}"
cmp -s "$SRC/plan.json" "$DEST/plan.json" || { echo "update_study: $SRC/plan.json differs from $DEST/plan.json" >&2; exit 2; }
for f in seeds.json runs.json report.json report.md collapse.png time_to_collapse.png accuracy.png; do
    [ -e "$SRC/$f" ] && cp "$SRC/$f" "$DEST/$f.partial" && mv "$DEST/$f.partial" "$DEST/$f"
done
echo "update_study: $DEST holds $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'])" "$DEST/report.json") recorded runs of $SRC"
