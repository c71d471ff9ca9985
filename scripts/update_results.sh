#!/usr/bin/env bash
# Regenerate docs/results/compare from a default `kpo compare`: run it (finished runs are reused, so on a
# finished compare this only re-evaluates what is missing and re-writes the report and its figures), then copy
# the files it writes at the top of its output directory. The runs themselves stay in OUT.
#
#   scripts/update_results.sh [OUT]     # OUT defaults to runs/compare; extra kpo compare flags via KPO_COMPARE_ARGS
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/compare}"
KPO="${KPO:-.venv/bin/kpo}"
DEST=docs/results/compare

# shellcheck disable=SC2086  # KPO_COMPARE_ARGS is a list of flags
"$KPO" compare --out "$OUT" ${KPO_COMPARE_ARGS:-}
rm -rf "$DEST" && mkdir -p "$DEST"   # a figure this report no longer draws must not linger
cp "$OUT"/*.md "$OUT"/*.json "$OUT"/*.png "$DEST/"
echo "update_results: $DEST now holds the report of $OUT"
