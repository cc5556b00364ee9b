#!/usr/bin/env bash
# Re-vendor the browser code the site serves itself (see README.md here), from the npm registry.
# Needs node and npm; the book's build and CI need neither (they copy these files).
#   bash _vendor/update.sh          # then commit what changed, with SHA256SUMS
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KATEX=0.19.1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# KaTeX: the release's own minified script, stylesheet and woff2 fonts (every browser the site
# supports reads woff2, so the stylesheet's woff and ttf fallbacks are never fetched).
(cd "$work" && npm pack --silent "katex@$KATEX" >/dev/null && tar xzf "katex-$KATEX.tgz")
rm -rf "$here/katex" && mkdir -p "$here/katex/fonts"
cp "$work/package/dist/katex.min.js" "$work/package/dist/katex.min.css" "$work/package/LICENSE" "$here/katex/"
cp "$work/package/dist/fonts/"*.woff2 "$here/katex/fonts/"

# plotly.js: a bundle of only the trace types the explorers draw (entry.js), built from the npm
# release with esbuild the way plotly.js's own bundles are (its CUSTOM_BUNDLE.md: the same
# format, global name, target and defines), at the versions package-lock.json pins.
mkdir -p "$work/plotly"
cp "$here/plotly/package.json" "$here/plotly/entry.js" "$work/plotly/"
[ -f "$here/plotly/package-lock.json" ] && cp "$here/plotly/package-lock.json" "$work/plotly/"
(cd "$work/plotly" && { [ -f package-lock.json ] && npm ci --silent --ignore-scripts --no-audit --no-fund \
                        || npm install --silent --ignore-scripts --no-audit --no-fund; } \
  && ./node_modules/.bin/esbuild entry.js --bundle --minify --format=iife --global-name=Plotly --target=es2016 \
       --define:global=window --define:define.amd=false --define:process.env.NODE_DEBUG=false \
       --legal-comments=none --log-level=warning --outfile=plotly.min.js)
cp "$work/plotly/package-lock.json" "$here/plotly/"
version=$(node -p "require('$work/plotly/node_modules/plotly.js/package.json').version")
{ printf '/**\n* plotly.js v%s (inflight site bundle: core + bar + heatmap; _vendor/update.sh)\n' "$version"
  printf '* Copyright 2012-2026, Plotly, Inc. All rights reserved. Licensed under the MIT license\n*/\n'
  cat "$work/plotly/plotly.min.js"; } >"$here/plotly/plotly.min.js"
cp "$work/plotly/node_modules/plotly.js/LICENSE" "$here/plotly/LICENSE"

(cd "$here" && find katex plotly -type f \( -name '*.js' -o -name '*.css' -o -name '*.woff2' \) \
   ! -name entry.js | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "vendored KaTeX $KATEX and plotly.js $version into $here"
