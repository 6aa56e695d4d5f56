#!/usr/bin/env bash
# test_package BUILD_DIR VERSION APP_ID CPACK: builds the Debian package from the build folder
# (cpack, which installs what the build made: run it after a full build), lints it, unpacks it
# into a temporary root and runs it from there:
#   - the package: lintian reports no error; Depends names no CUDA library (the CUDA runtime is
#     static, cuBLASLt and the driver are opened at run time) and the binaries need none;
#   - the files a desktop wants: desktop entry (desktop-file-validate; Exec takes %f, the GGUF MIME
#     type), icons at every hicolor size, the MIME type (update-mime-database compiles it, with the
#     GGUF magic), AppStream metadata (appstreamcli validate --no-net; its newest release is
#     VERSION), manual pages, copyright, changelog (its newest entry is VERSION);
#   - the binaries: `--version` prints "tokenfab-cli VERSION" / "tokenfab VERSION"; the packaged CLI
#     writes a tiny synthetic model, and the packaged app opens it as its positional argument (as
#     a file manager passes it) and renders the Models page offscreen (--screenshot), which lists
#     the opened file: nothing else is in the test's empty home.
# Lintian, run as the package is now (CMake 3.25's cpack, Debian 12), reports no error and no
# warning; at --display-info it reports, and this test allows:
#   - hardening-no-bindnow, hardening-no-fortify-functions: the project's compile flags (the
#     top-level CMakeLists.txt) do not add -Wl,-z,now or -D_FORTIFY_SOURCE=2;
#   - binary-has-unneeded-section .comment: cpack strips with `strip` alone, which keeps it;
#   - spelling-error-in-binary: "occured" is the static CUDA runtime's (CUDA builds); "allow to" is
#     a sentence of the compiled-in prompt set ("not one we can allow to continue"), "lengH" bytes
#     of machine code: neither is a misspelling.
set -euo pipefail
build_dir="$1"
version="$2"
app_id="$3"
cpack="$4"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "test_package: FAIL: $*" >&2
  exit 1
}
step() { echo "test_package: $*"; }

step "cpack -G DEB"
"$cpack" -G DEB -B "$tmp/out" --config "$build_dir/CPackConfig.cmake" >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log" >&2; fail "cpack failed"; }
debs=("$tmp"/out/tokenfab_*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || fail "expected one tokenfab_*.deb, got: ${debs[*]}"
deb="${debs[0]}"
dpkg-deb --info "$deb"

step "lintian"
lintian --display-info --fail-on error "$deb" || fail "lintian reports errors (above)"

step "control fields"
[ "$(dpkg-deb --field "$deb" Version)" = "$version" ] || fail "Version is not $version"
depends="$(dpkg-deb --field "$deb" Depends)"
grep -Eqi 'cuda|cublas|nvidia' <<<"$depends" && fail "Depends names a CUDA library: $depends"
for needed in python3 python3-pip libqt6gui6 libsqlite3-0; do
  grep -Eq "(^|, )$needed( |,|$)" <<<"$depends" || fail "Depends lacks $needed: $depends"
done

step "dpkg-deb -x"
root="$tmp/root"
dpkg-deb -x "$deb" "$root"
share="$root/usr/share"
for f in usr/bin/tokenfab usr/bin/tokenfab-cli \
  "usr/share/applications/$app_id.desktop" "usr/share/metainfo/$app_id.metainfo.xml" \
  "usr/share/mime/packages/$app_id.xml" "usr/share/icons/hicolor/scalable/apps/$app_id.svg" \
  usr/share/man/man1/tokenfab.1.gz usr/share/man/man1/tokenfab-cli.1.gz \
  usr/share/doc/tokenfab/copyright usr/share/doc/tokenfab/changelog.gz; do
  [ -f "$root/$f" ] || fail "the package has no /$f"
done
for size in 16 24 32 48 64 128 256; do
  png="$share/icons/hicolor/${size}x$size/apps/$app_id.png"
  [ -f "$png" ] || fail "the package has no ${size}x$size icon"
  file "$png" | grep -q "PNG image data, $size x $size" || fail "$png is not a ${size}x$size PNG"
done
for bin in tokenfab tokenfab-cli; do
  readelf --dynamic "$root/usr/bin/$bin" | grep NEEDED | grep -Eqi 'cuda|cublas|nvidia' &&
    fail "$bin links a CUDA library"
done

step "desktop entry"
desktop="$share/applications/$app_id.desktop"
desktop-file-validate "$desktop" || fail "desktop-file-validate: $desktop"
grep -qx 'Exec=tokenfab %f' "$desktop" || fail "Exec is not 'tokenfab %f'"
grep -qx 'MimeType=application/x-gguf;' "$desktop" || fail "MimeType is not application/x-gguf"
grep -qx "Icon=$app_id" "$desktop" || fail "Icon is not $app_id"

step "AppStream metadata"
metainfo="$share/metainfo/$app_id.metainfo.xml"
appstreamcli validate --no-net --explain "$metainfo" || fail "appstreamcli validate: $metainfo"
newest="$(grep -o '<release version="[^"]*"' "$metainfo" | head -n 1 | cut -d'"' -f2)"
[ "$newest" = "$version" ] || fail "the metainfo's newest release is $newest, not $version"
zcat "$share/doc/tokenfab/changelog.gz" | head -n 1 | grep -qF "tokenfab ($version)" ||
  fail "the changelog's newest entry is not $version"

step "MIME type"
cp -r "$share/mime" "$tmp/mime"
XDG_DATA_HOME="$tmp" update-mime-database "$tmp/mime" ||
  fail "update-mime-database rejects the MIME package"
[ -f "$tmp/mime/application/x-gguf.xml" ] || fail "no application/x-gguf after update-mime-database"
# The compiled magic: "[50:application/x-gguf]", then ">0=" (offset 0), a 2-byte length, "GGUF".
grep -a -A1 '^\[50:application/x-gguf\]$' "$tmp/mime/magic" | grep -aq '^>0=..GGUF$' ||
  fail "application/x-gguf has no magic GGUF at offset 0"
grep -q 'x-gguf.*\*\.gguf\|\*\.gguf.*x-gguf' "$tmp/mime/globs2" || fail "*.gguf is not a glob"

step "manual pages"
for bin in tokenfab tokenfab-cli; do
  zcat "$share/man/man1/$bin.1.gz" | grep -q "^\.TH ${bin^^} \"1\" .*\"$bin $version\"" \
    ||
    fail "$bin.1 does not name $bin $version"
done

step "--version"
export QT_QPA_PLATFORM=offscreen
[ "$("$root/usr/bin/tokenfab-cli" --version)" = "tokenfab-cli $version" ] ||
  fail "tokenfab-cli --version"
[ "$("$root/usr/bin/tokenfab" --version 2>/dev/null)" = "tokenfab $version" ] ||
  fail "tokenfab --version"

step "the app opens a GGUF file given as its argument"
# An empty home: the Models page lists only the file the app opened.
export HOME="$tmp/home" TOKENFAB_HOME="$tmp/home/tokenfab" XDG_RUNTIME_DIR="$tmp/run"
export XDG_CONFIG_HOME="$HOME/.config" XDG_DATA_HOME="$HOME/.local/share"
export XDG_CACHE_HOME="$HOME/.cache"
mkdir -p "$HOME" && mkdir -m 700 "$XDG_RUNTIME_DIR"
"$root/usr/bin/tokenfab-cli" synth --shape llama3-tiny --type q8_0 --out "$tmp/tiny.gguf" >/dev/null
"$root/usr/bin/tokenfab" --screenshot "$tmp/models.png" --view models "$tmp/tiny.gguf" \
  2>"$tmp/app.log" || { cat "$tmp/app.log" >&2; fail "tokenfab --screenshot failed"; }
cat "$tmp/app.log"
file "$tmp/models.png" | grep -q 'PNG image data' || fail "the screenshot is not a PNG"
grep -q 'models page: 1 models' "$tmp/app.log" || fail "the Models page does not list the file"
step "PASS"
