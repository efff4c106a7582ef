#!/usr/bin/env bash
# Would a fresh Debian machine have everything this build loaded?
#
# Every CMake package config that the configure step loaded (the *_DIR entries
# of CMakeCache.txt under /usr) and every pkg-config module it asked for must
# belong (dpkg -S) to a package that scripts/install-deps.sh installs, directly
# or through Depends (apt-cache depends --recurse, without Recommends: the
# script installs with --no-install-recommends). Packages installed by hand on
# a developer's machine otherwise hide a broken fresh set-up.
#
# usage: scripts/check-deps.sh [BUILD_DIR]     (exit 1 naming what is missing)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-${PHASELAB_BUILD_DIR:-$ROOT/build}}"
CACHE="$BUILD_DIR/CMakeCache.txt"
say() { printf 'check-deps: %s\n' "$*" >&2; }

[[ -f "$CACHE" ]] || { say "no $CACHE: configure first (scripts/build.sh)"; exit 1; }
command -v dpkg >/dev/null && command -v apt-cache >/dev/null || {
  say "dpkg and apt-cache are needed (this check is for Debian and its derivatives)"; exit 1; }

mapfile -t listed < <("$ROOT/scripts/install-deps.sh" --list)
[[ ${#listed[@]} -gt 0 ]] || { say "scripts/install-deps.sh --list printed no packages"; exit 1; }

# apt-cache knows nothing before the first 'apt-get update' on a fresh machine.
if [[ -z "$(apt-cache depends dpkg 2>/dev/null | grep -m1 Depends || true)" ]]; then
  say "apt's package lists are empty: run 'apt-get update' first"; exit 1
fi

# The install list and everything it pulls in through Depends / PreDepends.
closure="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
             --no-breaks --no-replaces --no-enhances "${listed[@]}" 2>/dev/null |
           grep -v '^ ' | sed 's/:any$//; s/:amd64$//; s/^<\(.*\)>$/\1/' | sort -u)"

owners_of() {  # the packages owning a file (one per line)
  dpkg -S "$1" 2>/dev/null | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//; s/:.*$//' | grep -v '^$' || true
}

checked=0; missing=()
check_file() {  # FILE WHAT: FILE must come from a package in the closure
  local file="$1" what="$2" owners o
  owners="$(owners_of "$(readlink -f "$file")")"
  [[ -n "$owners" ]] || owners="$(owners_of "$file")"
  [[ -n "$owners" ]] || return 0          # not from a package (e.g. the CUDA toolkit's own installer)
  checked=$((checked + 1))
  while read -r o; do
    grep -qxF "$o" <<<"$closure" && return 0
  done <<<"$owners"
  missing+=("$(head -n1 <<<"$owners") (for $what)")
}

# CMake package configs: <Name>_DIR:PATH=/usr/... holds <Name>Config.cmake or <name>-config.cmake.
while IFS='=' read -r key dir; do
  name="${key%%_DIR:PATH}"
  [[ "$name" == *_INCLUDE ]] && continue       # include folders of Find modules, not package configs
  [[ -d "$dir" ]] || continue
  cfg=""
  for c in "$dir/${name}Config.cmake" "$dir/$(tr '[:upper:]' '[:lower:]' <<<"$name")-config.cmake"; do
    [[ -f "$c" ]] && { cfg="$c"; break; }
  done
  [[ -n "$cfg" ]] || cfg="$(find "$dir" -maxdepth 1 \( -name '*Config.cmake' -o -name '*-config.cmake' \) | head -n1)"
  [[ -n "$cfg" ]] || continue
  check_file "$cfg" "find_package($name)"
done < <(grep -E '^[A-Za-z0-9_]+_DIR:PATH=/usr/' "$CACHE")

# pkg-config modules: pkg_check_modules(<PREFIX> ... module ...) leaves its arguments in the cache.
while IFS='=' read -r _ args; do
  IFS=';' read -r -a words <<<"$args"
  for m in "${words[@]}"; do
    case "$m" in REQUIRED|QUIET|IMPORTED_TARGET|GLOBAL|NO_CMAKE_PATH|NO_CMAKE_ENVIRONMENT_PATH|"") continue ;; esac
    m="${m%%[<>=]*}"
    pcdir="$(pkg-config --variable=pcfiledir "$m" 2>/dev/null || true)"
    [[ -n "$pcdir" && -f "$pcdir/$m.pc" ]] && check_file "$pcdir/$m.pc" "pkg-config $m"
  done
done < <(grep -E '^__pkg_config_arguments_[A-Za-z0-9_]+:INTERNAL=' "$CACHE")

if [[ ${#missing[@]} -gt 0 ]]; then
  printf 'check-deps: not installed by scripts/install-deps.sh: %s\n' "${missing[@]}" | sort -u >&2
  say "add the package(s) above to PACKAGES in scripts/install-deps.sh: a fresh machine would not have them"
  exit 1
fi
say "all $checked package configs and pkg-config modules the build loaded come from install-deps.sh's packages or their Depends"
