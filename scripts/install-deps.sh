#!/usr/bin/env bash
# Installs the Debian packages PhaseLab needs to build and run (idempotent:
# nothing is installed when everything is present). Uses sudo when not root.
# Every package the build or the tests load must be listed here:
# scripts/check-deps.sh (run by test.sh) fails naming any that is not.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libqt6sql6-sqlite qt6-svg-dev libgl-dev qtkeychain-qt6-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libpcre2-dev
  libboost-context-dev
  # phaselab-cli serve / --remote: HTTP server and client; the server's tests use curl and python3-venv
  libcpp-httplib-dev curl python3-venv
  # test_jinja: Python's jinja2 renders the chat templates PhaseLab's interpreter is compared with
  python3-jinja2
  # phaselab-cli pull / Get Models: HTTPS to Hugging Face and SHA-256 of the files (OpenSSL), its CA list
  libssl-dev ca-certificates
  # test_hub makes a self-signed certificate to check that HTTPS is verified
  openssl
  xvfb xauth
  # scripts/screenshots.sh: drive the real window in Xvfb and capture it
  xdotool imagemagick
  # packaging and its test: .deb/.rpm/.tgz, lintian, desktop integration
  lintian rpm cpio desktop-file-utils appstream shared-mime-info xdg-utils libglib2.0-bin
  # xdg-mime asks perl's mimetype for a file's type (only recommended by xdg-utils; without it
  # xdg-mime falls back to file(1), which knows no GGUF)
  libfile-mimeinfo-perl
  # scripts/fuzz.sh: clang with libFuzzer and the sanitizer runtimes (only recommended by clang)
  clang libclang-rt-14-dev
)

# --list: the package names, one per line (scripts/check-deps.sh reads them).
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# python3 -m pip may come from a non-Debian Python; then python3-pip is not needed.
if [[ " ${missing[*]} " == *" python3-pip "* ]] && python3 -m pip --version >/dev/null 2>&1; then
  missing=("${missing[@]/python3-pip}")
fi
read -r -a missing <<< "${missing[*]:-}"

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all packages present" >&2
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
