#!/usr/bin/env bash
# Stages the ladder's header-only dependencies (Eigen 3.4, Catch2 2.13, CLI11) as a relocatable
# CMake prefix, for a GPU machine that cannot install packages. Here (Debian 12, with package
# access):
#   tools/stage-deps.sh [DEST]          # DEST defaults to .deps in the repository root
# then carry DEST along with the checkout, and there:
#   cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.deps
# CMAKE_PREFIX_PATH is searched before the system prefixes, so find_package(Catch2 2) takes the
# staged v2 even where /usr has a Catch2 v3 (whose headers and CMake config the ladder cannot
# use). The staged files keep their layout below /usr, and their CMake configs locate themselves
# relative to their own folder, so DEST works wherever it is moved. Missing Debian packages are
# installed here first (apt-get; sudo when not root). DEST is git-ignored (.gitignore: .deps/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.deps}
pkgs=(libeigen3-dev catch2 libcli11-dev)

missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "stage-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Never delete a folder this script did not make: DEST must be new, empty, or a previous staging.
marker=.staged-by-stage-deps
if [ -e "$dest" ] && [ -n "$(ls -A "$dest")" ] && [ ! -e "$dest/$marker" ]; then
  echo "stage-deps: $dest exists and was not made by this script; choose another DEST" >&2
  exit 2
fi
rm -rf "$dest"
mkdir -p "$dest"
touch "$dest/$marker"

# Every file of the packages below /usr, at the same relative path: headers, CMake configs and
# Catch2's main library. Not the docs, and not pkg-config files (they name /usr literally).
for p in "${pkgs[@]}"; do
  dpkg -L "$p" | grep '^/usr/' | grep -vE '^/usr/share/doc/|/pkgconfig/' | while read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then
      mkdir -p "$dest/$(dirname "${f#/usr/}")"
      cp -p "$f" "$dest/${f#/usr/}"
    fi
  done
done

version() { dpkg-query -W -f='${Version}' "$1"; }
case $(version catch2) in
  2.*) ;;
  *) echo "stage-deps: catch2 $(version catch2) is not Catch2 v2; the ladder's tests need v2" >&2
     exit 1 ;;
esac
for cfg in Eigen3Config.cmake Catch2Config.cmake CLI11Config.cmake; do
  [ -n "$(find "$dest" -name "$cfg" -print -quit)" ] ||
    { echo "stage-deps: no $cfg staged in $dest" >&2; exit 1; }
done
echo "stage-deps: Eigen $(version libeigen3-dev), Catch2 $(version catch2)," \
     "CLI11 $(version libcli11-dev) staged in $dest ($(du -sh "$dest" | cut -f1))"
echo "stage-deps: configure with -DCMAKE_PREFIX_PATH=$dest"
