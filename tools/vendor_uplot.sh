#!/usr/bin/env bash
# Vendor uPlot (MIT) for the dashboard's static front end (issue 25).
#
# Fetches uplot@VERSION from the npm registry with `npm pack` into a temporary directory and
# copies the three files the page needs into packages/agent/tacc_agent/dashboard/static/:
#   uPlot.iife.min.js  (dist/uPlot.iife.min.js)
#   uPlot.min.css      (dist/uPlot.min.css)
#   uPlot.LICENSE      (LICENSE)
# then prints their sha256. tests/unit/agent/test_dashboard_static.py pins those sums: after a
# version bump, run this script and update the pins there.
#
# Usage: tools/vendor_uplot.sh            (needs npm and network access to the npm registry)
set -euo pipefail

VERSION="1.6.32"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/packages/agent/tacc_agent/dashboard/static"

command -v npm >/dev/null || { echo "vendor_uplot.sh: npm is not installed" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "uplot@$VERSION" >/dev/null)
tar -xzf "$WORK/uplot-$VERSION.tgz" -C "$WORK"

mkdir -p "$DEST"
install -m 0644 "$WORK/package/dist/uPlot.iife.min.js" "$DEST/uPlot.iife.min.js"
install -m 0644 "$WORK/package/dist/uPlot.min.css" "$DEST/uPlot.min.css"
install -m 0644 "$WORK/package/LICENSE" "$DEST/uPlot.LICENSE"

echo "uPlot $VERSION vendored into ${DEST#"$ROOT"/}:"
(cd "$DEST" && sha256sum uPlot.iife.min.js uPlot.min.css uPlot.LICENSE)
