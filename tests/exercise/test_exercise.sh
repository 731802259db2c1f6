#!/usr/bin/env bash
# exercise.roundtrip: tools/exercise.py end to end on step 02, as a learner would use it.
#   test_exercise.sh SOURCE_DIR SCRATCH_DIR [CXX_COMPILER]
# create makes the copy (markers and hint kept, solution gone) and never overwrites a copy
# without --force (which keeps a backup); the copy builds with -DLADDER_EXERCISES; the harness
# and the step program fail with "not implemented"; grade says FAIL; with the solution pasted
# back, grade says PASS and diff finds nothing.
# The build folder in SCRATCH_DIR is kept between runs, so only the first run compiles the
# plumbing (about a minute on 2 idle cores); CUDA is off there: step 02 needs none of it.
set -uo pipefail
src=$1
scratch=$2
cxx=${3:-}
ex=$scratch/ex
build=$scratch/build
copy=$ex/02_online_softmax/online_softmax.cpp
solution=$src/steps/02_online_softmax/online_softmax.cpp

exercise() { python3 "$src/tools/exercise.py" "$@"; }
fail() {
  echo "FAIL: $*"
  exit 1
}
# must LOG MESSAGE COMMAND...: run COMMAND with its output in $scratch/LOG; on failure show
# the end of that log and fail with MESSAGE.
must() {
  local log=$scratch/$1 msg=$2
  shift 2
  "$@" >"$log" 2>&1 || { tail -n 40 "$log"; fail "$msg"; }
}
# has PATTERN FILE MESSAGE: FILE contains PATTERN (extended regex), or fail showing FILE.
has() {
  grep -Eq -- "$1" "$2" || { tail -n 40 "$2"; fail "$3"; }
}

rm -rf "$ex"
mkdir -p "$scratch"

echo "== list and create"
must list.log "list failed" exercise list
has 'online-update' "$scratch/list.log" "list misses the region online-update"
must create.log "create failed" exercise create 2 --dir "$ex"
has 'LADDER_TODO\("online-update"\);' "$copy" "no LADDER_TODO in the copy"
has '// EXERCISE BEGIN online-update' "$copy" "the BEGIN marker was lost"
has '// Fold key j' "$copy" "the hint was lost"
has '// EXERCISE END' "$copy" "the END marker was lost"
grep -q 'l = alpha \* l + pij;' "$copy" && fail "the solution is still in the copy"

echo "== create never overwrites a learner's work without --force"
echo "// my work" >>"$copy"
exercise create 2 --dir "$ex" >"$scratch/refuse.log" 2>&1 && fail "create overwrote a copy"
has 'already exists' "$scratch/refuse.log" "create refused without saying why"
has '// my work' "$copy" "the learner's work was lost"
must force.log "create --force failed" exercise create 2 --dir "$ex" --force
grep -q '// my work' "$copy" && fail "create --force left the old copy in place"
grep -qs '// my work' "$ex"/.backup/02_online_softmax.*/online_softmax.cpp ||
  fail "create --force kept no backup of the learner's work"

echo "== build the exercise copy"
must configure.log "configure failed" \
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLADDER_EXERCISES="$ex" \
  -DLADDER_ENABLE_CUDA=OFF ${cxx:+-DCMAKE_CXX_COMPILER="$cxx"}
has 'building the exercise copy' "$scratch/configure.log" "cmake did not use the copy"
start=$SECONDS
must build.log "the exercise copy does not compile" \
  cmake --build "$build" --target harness 02_online_softmax
echo "built in $((SECONDS - start)) s"

echo "== the unfinished copy fails, saying why"
"$build/tests/harness" --step 2 >"$scratch/harness.log" 2>&1 &&
  fail "the harness passed an unfinished exercise"
has 'not implemented' "$scratch/harness.log" "the harness did not say 'not implemented'"
"$build/steps/02_online_softmax" --seq-q 17 --seq-k 33 >"$scratch/run.log" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "the step program exited $rc, not 1"
has 'not implemented' "$scratch/run.log" "the step program did not say 'not implemented'"
exercise grade 2 --dir "$ex" --build "$build" >"$scratch/grade-todo.log" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -n 40 "$scratch/grade-todo.log"; fail "grade exited $rc, not 1"; }
has '^FAIL' "$scratch/grade-todo.log" "grade of the unfinished copy did not say FAIL"

echo "== the solved copy passes"
cp "$solution" "$copy"
must grade.log "grade of the solution failed" exercise grade 2 --dir "$ex" --build "$build"
has '^PASS' "$scratch/grade.log" "grade did not say PASS"
must diff.log "diff failed" exercise diff 2 --dir "$ex"
has 'identical' "$scratch/diff.log" "diff found changes in a copy of the solution"

echo "exercise.roundtrip: every check passed"
