#!/usr/bin/env bash
# Renders the application icon resources/icons/tokenfab.svg to the PNG sizes the freedesktop
# hicolor theme wants (resources/icons/png/tokenfab-N.png, N = 16 24 32 48 64 128 256). The PNGs
# are committed: the build and the package use them as they are (the app embeds them as its
# window icon; installers/ installs them), so only this script needs rsvg-convert (Debian:
# librsvg2-bin). Run it again after editing the SVG.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v rsvg-convert >/dev/null || {
  echo "render_icons: rsvg-convert not found (sudo apt-get install librsvg2-bin)" >&2
  exit 1
}
mkdir -p "$root/resources/icons/png"
for size in 16 24 32 48 64 128 256; do
  rsvg-convert --width "$size" --height "$size" --format png \
    --output "$root/resources/icons/png/tokenfab-$size.png" "$root/resources/icons/tokenfab.svg"
done
ls -l "$root/resources/icons/png"
