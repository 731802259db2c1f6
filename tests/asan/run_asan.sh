#!/usr/bin/env bash
# asan.cpu: build the CPU rungs, the driver and the CPU tests with -fsanitize=address,undefined
# in SCRATCH (a second build folder, CUDA off) and run the CPU tests there. Any sanitizer
# report aborts the program that made it (-fno-sanitize-recover), which fails its test.
#   run_asan.sh SOURCE_DIR SCRATCH_DIR [CXX_COMPILER]
# The build folder is kept between runs, so only the first run compiles everything.
set -uo pipefail
src=$1
build=$2
cxx=${3:-c++}
echo 'int main() { return 0; }' >"${TMPDIR:-/tmp}/ladder_asan_probe.cpp"
if ! "$cxx" -fsanitize=address,undefined "${TMPDIR:-/tmp}/ladder_asan_probe.cpp" \
    -o "${TMPDIR:-/tmp}/ladder_asan_probe" 2>/dev/null; then
  echo "NOT RUN: $cxx cannot build with -fsanitize=address,undefined here"
  exit 77
fi
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DLADDER_ENABLE_CUDA=OFF -DLADDER_SANITIZE=address,undefined >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" 2>&1 | tail -n 5
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
# The cpu label only: the slow tests (this one, and the exercise round trip, which builds yet
# another tree) run in the main build.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir "$build" -L cpu --output-on-failure --no-tests=error -j "$(nproc)"
