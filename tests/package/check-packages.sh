#!/usr/bin/env bash
# The packages as a person gets them. Builds the DEB, RPM and TGZ packages from
# the build folder, checks them (lintian, desktop-file-validate, appstreamcli),
# installs the .debs on this machine, runs the installed phaselab-cli and the
# GUI's unattended mode with no build tree on the path, opens a .gguf the way
# a file manager does (gio open -> the desktop file -> phaselab FILE), checks
# the icon and the MIME type, purges the packages and checks that nothing they
# installed is left. The TGZ and the RPM are unpacked into odd folders and run
# from there.
#
# usage: check-packages.sh BUILD_DIR SOURCE_DIR
# Needs root (or sudo without a password) to install; without it the test is
# skipped (exit 77) with the reason, unless PHASELAB_REQUIRE_PACKAGE_TEST=1
# (CI sets it) makes that a failure.
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$(cd "$2" && pwd)"
ID=io.github.phaselab.PhaseLab
MODEL="$SRC/tests/data/stories260K.gguf"
PROMPT="Once upon a time"

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
skip() {
  if [[ "${PHASELAB_REQUIRE_PACKAGE_TEST:-0}" == 1 ]]; then fail "$* (PHASELAB_REQUIRE_PACKAGE_TEST=1)"; fi
  printf 'SKIP: %s\n' "$*"; exit 77
}

for tool in cpack dpkg-deb lintian desktop-file-validate appstreamcli apt-get rpm rpm2cpio cpio gio xdg-mime; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/install-deps.sh"
done
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  sudo -n true 2>/dev/null || skip "installing the .deb needs root or sudo without a password"
  SUDO=(sudo -n)
fi
if dpkg-query -W -f='${Status}' phaselab 2>/dev/null | grep -q "ok installed"; then
  fail "a phaselab package is already installed here; this test installs and purges its own (apt-get purge phaselab phaselab-cuda first)"
fi

WORK="$(mktemp -d /tmp/phaselab-package-test.XXXXXX)"
INSTALLED=0
cleanup() {
  [[ -n "${APP_PID:-}" ]] && kill "$APP_PID" 2>/dev/null
  pkill -f "$WORK/home" 2>/dev/null || true
  if (( INSTALLED )); then "${SUDO[@]}" apt-get purge -y -qq phaselab-cuda phaselab >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# A clean environment for what runs from the packages: no build tree on the
# path, a home of its own.
mkdir -p "$WORK/home"
clean_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$WORK/home" LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen)

step "build the packages (cpack DEB, RPM, TGZ)"
cpack -G "DEB;RPM;TGZ" -B "$WORK/out" --config "$BUILD/CPackConfig.cmake" > "$WORK/cpack.log" 2>&1 ||
  { cat "$WORK/cpack.log"; fail "cpack failed"; }
ls -l "$WORK/out"/*.deb "$WORK/out"/*.rpm "$WORK/out"/*.tar.gz
APP_DEB=$(ls "$WORK/out"/phaselab_*.deb)
CUDA_DEB=$(ls "$WORK/out"/phaselab-cuda_*.deb 2>/dev/null || true)
DEBS=("$APP_DEB")
[[ -n "$CUDA_DEB" ]] && DEBS+=("$CUDA_DEB")

step "contents and control fields"
dpkg-deb -c "$APP_DEB" | awk '{print $6}' | sed 's|^\./|/|' > "$WORK/app.list"
for f in /usr/bin/phaselab /usr/bin/phaselab-cli /usr/libexec/phaselab/phaselab-fetch-model \
         /usr/share/applications/$ID.desktop /usr/share/mime/packages/$ID.xml \
         /usr/share/metainfo/$ID.metainfo.xml /usr/share/icons/hicolor/scalable/apps/$ID.svg \
         /usr/share/icons/hicolor/48x48/apps/$ID.png /usr/share/icons/hicolor/256x256/apps/$ID.png \
         /usr/share/man/man1/phaselab.1.gz /usr/share/man/man1/phaselab-cli.1.gz \
         /usr/share/doc/phaselab/copyright /usr/share/doc/phaselab/changelog.Debian.gz \
         /usr/share/phaselab/text/eval-en.txt /usr/share/phaselab/text/demo-prompts.txt; do
  grep -qxF "$f" "$WORK/app.list" || fail "$APP_DEB lacks $f"
done
grep -q "libphaselab_cuda" "$WORK/app.list" && fail "the CUDA backend belongs in phaselab-cuda, not phaselab"
dpkg-deb -f "$APP_DEB" Depends | tee "$WORK/depends"
grep -q "libqt6widgets6" "$WORK/depends" || fail "Depends was not computed from the binaries (no libqt6widgets6)"
grep -Eq "libspdlog1\.[0-9]+" "$WORK/depends" || fail "Depends lacks the spdlog the binaries link"
grep -qi "cuda\|cublas" "$WORK/depends" && fail "phaselab must not depend on CUDA"
[[ "$(dpkg-deb -f "$APP_DEB" Homepage)" == https://* ]] || fail "no Homepage field"
[[ $(dpkg-deb -f "$APP_DEB" Description | wc -l) -ge 3 ]] || fail "no extended description"
if [[ -n "$CUDA_DEB" ]]; then
  dpkg-deb -c "$CUDA_DEB" > "$WORK/cuda.list"
  grep -q "usr/lib/phaselab/libphaselab_cuda.so" "$WORK/cuda.list" || fail "phaselab-cuda lacks the library"
  dpkg-deb -f "$CUDA_DEB" Depends | grep -qi "cuda\|cublas" && fail "phaselab-cuda must only recommend CUDA"
  dpkg-deb -f "$CUDA_DEB" Recommends
fi

step "lintian (errors fail; warnings are explained in packaging/README.md)"
lintian --fail-on error --tag-display-limit 0 "${DEBS[@]}" 2>&1 | tee "$WORK/lintian.log" ||
  fail "lintian reports errors"

step "desktop-file-validate, appstreamcli validate"
mkdir -p "$WORK/deb-root"
dpkg-deb -x "$APP_DEB" "$WORK/deb-root"
desktop-file-validate "$WORK/deb-root/usr/share/applications/$ID.desktop" || fail "desktop-file-validate"
appstreamcli validate --no-net "$WORK/deb-root/usr/share/metainfo/$ID.metainfo.xml" || fail "appstreamcli validate"
appstreamcli validate-tree --no-net "$WORK/deb-root" || fail "appstreamcli validate-tree"

step "install the packages"
snapshot() {  # every file and folder the packages could touch, with the caches' contents
  find /usr /etc /opt /var/lib -xdev \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/ucf \
       -o -path /var/lib/systemd -o -path /var/lib/dhcp -o -path /var/lib/polkit-1 \) -prune -o -print 2>/dev/null | sort
}
snapshot > "$WORK/before.txt"
INSTALLED=1
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${DEBS[@]}" \
  > "$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "the packages do not install"; }
dpkg -L phaselab > "$WORK/installed.txt"
[[ -n "$CUDA_DEB" ]] && dpkg -L phaselab-cuda >> "$WORK/installed.txt"

step "run the installed phaselab-cli"
[[ "$("${clean_env[@]}" phaselab-cli --version)" == "phaselab-cli "* ]] || fail "phaselab-cli --version"
"${clean_env[@]}" phaselab-cli --help | grep -q "usage: phaselab-cli" || fail "phaselab-cli --help"
"${clean_env[@]}" phaselab-cli devices || fail "phaselab-cli devices"
"${clean_env[@]}" phaselab-cli generate -m "$MODEL" -p "$PROMPT" -n 24 --temp 0 > "$WORK/installed.out" 2>/dev/null ||
  fail "the installed phaselab-cli generate failed"
"$BUILD/app/phaselab-cli" generate -m "$MODEL" -p "$PROMPT" -n 24 --temp 0 > "$WORK/build.out" 2>/dev/null
cat "$WORK/installed.out"; echo
[[ -s "$WORK/installed.out" ]] || fail "the installed phaselab-cli generated nothing"
cmp -s "$WORK/installed.out" "$WORK/build.out" || fail "the installed phaselab-cli's text differs from the build tree's"

step "run the installed GUI unattended"
[[ "$("${clean_env[@]}" phaselab --version)" == *"0."* ]] || fail "phaselab --version"
"${clean_env[@]}" phaselab --help | grep -q "FILE.gguf" || fail "phaselab --help does not name the FILE argument"
"${clean_env[@]}" timeout 120 phaselab --model "$MODEL" --prompt "$PROMPT" -n 8 --temp 0 \
  --db "$WORK/home/shot.sqlite" --screenshot "$WORK/shot.png" --quit > "$WORK/gui.out" 2>&1 ||
  { cat "$WORK/gui.out"; fail "the installed GUI's unattended run failed"; }
[[ $(stat -c %s "$WORK/shot.png") -gt 10000 ]] || fail "no screenshot from the installed GUI"
python3 - "$WORK/shot.png" <<'PY' || fail "the screenshot is not a PNG of a window"
import struct, sys
d = open(sys.argv[1], "rb").read(24)
assert d[:8] == b"\x89PNG\r\n\x1a\n"
w, h = struct.unpack(">II", d[16:24])
assert w >= 640 and h >= 400, (w, h)
PY

step "the icon and the MIME type, as the desktop sees them"
for size in 16 32 48 64 128 256; do
  png=/usr/share/icons/hicolor/${size}x${size}/apps/$ID.png
  python3 - "$png" "$size" <<'PY' || fail "$png is not a ${size}x${size} PNG"
import struct, sys
d = open(sys.argv[1], "rb").read(24)
assert d[:8] == b"\x89PNG\r\n\x1a\n"
assert struct.unpack(">II", d[16:24]) == (int(sys.argv[2]),) * 2
PY
done
grep -qx "Icon=$ID" /usr/share/applications/$ID.desktop || fail "the desktop file names another icon"
grep -qx "MimeType=application/x-gguf;" /usr/share/applications/$ID.desktop || fail "the desktop file does not claim application/x-gguf"
cp "$MODEL" "$WORK/home/My Model.gguf"
head -c 4096 "$MODEL" > "$WORK/home/no-extension"
desk_env=("${clean_env[@]}" XDG_DATA_DIRS=/usr/local/share:/usr/share XDG_CONFIG_DIRS=/etc/xdg)
type=$("${desk_env[@]}" xdg-mime query filetype "$WORK/home/My Model.gguf")
[[ "$type" == application/x-gguf ]] || fail "xdg-mime says $type for a .gguf"
type=$("${desk_env[@]}" gio info -a standard::content-type "$WORK/home/no-extension" | awk '/content-type/ {print $2}')
[[ "$type" == application/x-gguf ]] || fail "GGUF magic not recognised (gio says $type)"
default=$("${desk_env[@]}" xdg-mime query default application/x-gguf)
[[ "$default" == "$ID.desktop" ]] || fail "the default application for GGUF is '$default', not $ID.desktop"

step "open a .gguf as a file manager does (gio open)"
# gio launches Exec=phaselab %f from the desktop file, with this environment.
( cd "$WORK/home" && exec "${desk_env[@]}" PHASELAB_LOG=info gio open "$WORK/home/My Model.gguf" ) \
  > "$WORK/open.out" 2>&1 &
log="$WORK/home/.local/share/PhaseLab/logs/phaselab.log"
for _ in $(seq 1 120); do
  grep -q "gui: loaded model $WORK/home/My Model.gguf" "$log" 2>/dev/null && break
  sleep 0.5
done
grep "gui: loaded model $WORK/home/My Model.gguf" "$log" 2>/dev/null ||
  { cat "$WORK/open.out" "$log"; ps aux | grep [p]haselab; fail "gio open did not start phaselab with the file"; }
APP_PID=$(pgrep -f "^phaselab $WORK/home/My Model.gguf" || pgrep -f "phaselab .*$WORK/home/My Model.gguf" | head -n1)
[[ -n "$APP_PID" ]] || fail "no phaselab process was started by gio open"
ps -o args= -p "$APP_PID"
kill "$APP_PID"; sleep 1; APP_PID=""

step "purge, and look for traces"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq phaselab-cuda phaselab > "$WORK/purge.log" 2>&1 ||
  { cat "$WORK/purge.log"; fail "purge failed"; }
INSTALLED=0
dpkg-query -W -f='${Status}\n' phaselab 2>/dev/null | grep -q installed && fail "phaselab is still installed"
while read -r f; do
  [[ -e "$f" && ! -d "$f" ]] && fail "$f is left after the purge"
done < "$WORK/installed.txt"
snapshot > "$WORK/after.txt"
if ! diff "$WORK/before.txt" "$WORK/after.txt" > "$WORK/diff.txt"; then
  cat "$WORK/diff.txt"; fail "the machine differs after install + purge"
fi
grep -rqs "x-gguf" /usr/share/mime/ && fail "the MIME database still knows application/x-gguf"
grep -qs "$ID" /usr/share/applications/mimeinfo.cache && fail "the desktop database still lists $ID"

step "TGZ: unpacked into a folder of its own, run from there"
mkdir -p "$WORK/unpacked tgz/deep"
tar -C "$WORK/unpacked tgz/deep" -xzf "$WORK"/out/phaselab-*.tar.gz
root=$(ls -d "$WORK/unpacked tgz/deep"/phaselab-*)
for f in bin/phaselab bin/phaselab-cli libexec/phaselab/phaselab-fetch-model share/applications/$ID.desktop; do
  [[ -e "$root/$f" ]] || fail "the TGZ lacks $f"
done
"${clean_env[@]}" "$root/bin/phaselab-cli" generate -m "$MODEL" -p "$PROMPT" -n 24 --temp 0 > "$WORK/tgz.out" 2>/dev/null ||
  fail "phaselab-cli from the TGZ failed"
cmp -s "$WORK/tgz.out" "$WORK/build.out" || fail "the TGZ's phaselab-cli text differs"
"${clean_env[@]}" timeout 120 "$root/bin/phaselab" --model "$MODEL" --prompt "$PROMPT" -n 4 --temp 0 \
  --db "$WORK/home/tgz.sqlite" --quit > /dev/null 2>&1 || fail "phaselab from the TGZ failed"

step "RPM: listed, unpacked, run"
APP_RPM=$(ls "$WORK"/out/phaselab-[0-9]*.rpm)
rpm -qpl "$APP_RPM" 2>/dev/null | tee "$WORK/rpm.list" | grep -E "bin/|\.desktop$"
grep -qx /usr/bin/phaselab-cli "$WORK/rpm.list" || fail "the RPM lacks /usr/bin/phaselab-cli"
grep -qx "/usr/share/applications/$ID.desktop" "$WORK/rpm.list" || fail "the RPM lacks the desktop file"
rpm -qp --requires "$APP_RPM" > "$WORK/rpm.requires" 2>/dev/null
grep -qi "libcudart\|libcublas" "$WORK/rpm.requires" && fail "the phaselab RPM requires CUDA"
mkdir -p "$WORK/rpm-root"
(cd "$WORK/rpm-root" && rpm2cpio "$APP_RPM" | cpio -idm --quiet)
"${clean_env[@]}" "$WORK/rpm-root/usr/bin/phaselab-cli" generate -m "$MODEL" -p "$PROMPT" -n 24 --temp 0 \
  > "$WORK/rpm.out" 2>/dev/null || fail "phaselab-cli from the RPM failed"
cmp -s "$WORK/rpm.out" "$WORK/build.out" || fail "the RPM's phaselab-cli text differs"

printf '\nPASS: DEB (lintian, desktop, AppStream, install, run, open, purge), TGZ and RPM\n'
