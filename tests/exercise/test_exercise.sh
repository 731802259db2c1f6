#!/usr/bin/env bash
# exercise.roundtrip: tools/exercise.py end to end on step 02, as a learner would use it.
#   test_exercise.sh SOURCE_DIR SCRATCH_DIR [CXX_COMPILER]
# create makes the copy (markers, concept and hint kept, solution gone) and never overwrites a
# copy without --force (which keeps a backup); grade builds the copy (-DLADDER_EXERCISES, only
# step 02, no CUDA) and says FAIL naming the blank regions; the step program and the harness
# say "not implemented"; a wrong solution FAILs naming the case and what it exercises; the
# solution pasted back PASSes and diff finds nothing.
# The build folder in SCRATCH_DIR is kept between runs, so only the first run compiles the
# plumbing (notes/EXERCISES.md has the times); later runs rebuild only the copy.
set -uo pipefail
src=$1
scratch=$2
cxx=${3:-}
ex=$scratch/ex
build=$scratch/build
copy=$ex/02_online_softmax/online_softmax.cpp
solution=$src/steps/02_online_softmax/online_softmax.cpp
[ -n "$cxx" ] && export CXX=$cxx # the compiler of the build that runs this test

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
# grade_fails LOG: grade the copy, expecting exit status 1 (FAIL).
grade_fails() {
  exercise grade 2 --dir "$ex" --build "$build" >"$scratch/$1" 2>&1
  local rc=$?
  [ $rc -eq 1 ] || { tail -n 40 "$scratch/$1"; fail "grade exited $rc, not 1"; }
  has '^FAIL' "$scratch/$1" "grade did not say FAIL"
}

rm -rf "$ex"
mkdir -p "$scratch"

echo "== list and create"
must list.log "list failed" exercise list
has 'online-update +\[hard\]' "$scratch/list.log" "list misses the region online-update [hard]"
must create.log "create failed" exercise create 2 --dir "$ex"
has 'LADDER_TODO\("online-update"\);' "$copy" "no LADDER_TODO in the copy"
has '// EXERCISE BEGIN online-update \[hard\]' "$copy" "the BEGIN marker was lost"
has '// Concept: the online-softmax rescale' "$copy" "the concept was lost"
has '// Invariant, over the keys folded so far' "$copy" "the hint was lost"
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

echo "== the unfinished copy fails, saying which regions are blank"
start=$SECONDS
grade_fails grade-todo.log
echo "graded the blank copy in $((SECONDS - start)) s"
has "not implemented: 'online-max-sum' .*'online-update' .*'tile-update'" "$scratch/grade-todo.log" \
  "grade did not name the blank regions"
grep -Eq "^LADDER_EXERCISES:[A-Z]+=$ex\$" "$build/CMakeCache.txt" ||
  fail "grade did not configure $build to build the exercise copy"
grep -q 'wrong result' "$scratch/grade-todo.log" && fail "a blank copy was called a wrong result"
"$build/tests/harness" --step 2 >"$scratch/harness.log" 2>&1 &&
  fail "the harness passed an unfinished exercise"
has '^  TODO .*\[one-pass\]' "$scratch/harness.log" "the harness did not mark a blank run TODO"
has 'not implemented' "$scratch/harness.log" "the harness did not say 'not implemented'"
must program.log "the step program does not build" \
  cmake --build "$build" --target 02_online_softmax
"$build/steps/02_online_softmax" --seq-q 17 --seq-k 33 >"$scratch/run.log" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "the step program exited $rc, not 1"
has 'not implemented' "$scratch/run.log" "the step program did not say 'not implemented'"

echo "== a wrong solution fails, naming the case"
# The solution with one mistake: o is not rescaled when the running max grows.
sed 's/o\[size_t(c)\] = alpha \* o\[size_t(c)\] + pij \* vj\[c\];/o[size_t(c)] += pij * vj[c];/' \
  "$solution" >"$copy"
grep -q 'o\[size_t(c)\] += pij \* vj\[c\];' "$copy" || fail "could not plant the mistake"
start=$SECONDS
grade_fails grade-wrong.log
echo "graded the changed copy in $((SECONDS - start)) s"
has "wrong result in [0-9]+ of [0-9]+ runs \\(your code in region 'online-update'\\); the first: .*\\[one-pass\\]" \
  "$scratch/grade-wrong.log" "grade did not name the region and the first failing run"
has 'over tolerance: O [-+0-9.e]+ > [-+0-9.e]+' "$scratch/grade-wrong.log" \
  "grade did not list the first failing run's tensors over tolerance"
has 'O error .* > tol' "$scratch/grade-wrong.log" "grade did not give the error and tolerance"
has 'this case exercises: ' "$scratch/grade-wrong.log" "grade did not say what the case exercises"
grep -q 'not implemented' "$scratch/grade-wrong.log" && fail "a wrong result was called blank"

echo "== the solved copy passes"
cp "$solution" "$copy"
must grade.log "grade of the solution failed" exercise grade 2 --dir "$ex" --build "$build"
has '^PASS' "$scratch/grade.log" "grade did not say PASS"
must diff.log "diff failed" exercise diff 2 --dir "$ex"
has 'identical' "$scratch/diff.log" "diff found changes in a copy of the solution"

echo "exercise.roundtrip: every check passed"
