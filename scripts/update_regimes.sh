#!/usr/bin/env bash
# Copy a regime map (kpo compare regimes --out OUT) into docs/results: the map's report.md, report.json,
# plan.json and figures, and each finished cell's own report (OUT/CELL/report.md, its JSON and figures). It trains
# nothing: the map is rewritten by kpo compare regimes as each cell finishes, so this can run while it works (a
# partial map, committed as cells finish) and again at the end. The runs themselves stay in OUT.
#
#   scripts/update_regimes.sh [OUT] [DEST]    # defaults: runs/regimes docs/results/regimes
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/regimes}"
DEST="${2:-docs/results/regimes}"
[ -f "$OUT/report.md" ] || { echo "update_regimes: $OUT has no report.md yet (no cell has finished)" >&2; exit 2; }
rm -rf "$DEST" && mkdir -p "$DEST"   # a cell or figure this map no longer has must not linger
cp "$OUT"/*.md "$OUT"/*.json "$OUT"/*.png "$DEST/"
for report in "$OUT"/*/report.md; do
    [ -e "$report" ] || continue
    cell="$(basename "$(dirname "$report")")"
    mkdir -p "$DEST/$cell"
    cp "$OUT/$cell"/*.md "$OUT/$cell"/*.json "$OUT/$cell"/*.png "$DEST/$cell/"
done
echo "update_regimes: $DEST now holds the map of $OUT"
