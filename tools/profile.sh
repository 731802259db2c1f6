#!/usr/bin/env bash
# One Nsight Compute profile of one kernel launch of a command: the sections the notes quote
# (speed of light, pipes, instruction mix, issue slots, warp stalls, occupancy, memory), saved as
# a report and printed as text. The clocks are left alone (--clock-control none), so durations
# are those of a timed run.
#   tools/profile.sh NAME KERNEL_REGEX COMMAND...
# e.g.
#   tools/profile.sh 06-fwd-d64-p0.1 forward_kernel build-gpu/ladder bench --steps 6 \
#     --dtype bf16 --dims 64 --seqlens 4096 --causal 0 --directions fwd --dropout 0.1 \
#     --warmup 0 --repeats 1
#   tools/profile.sh flash-fwd-d64 flash_fwd python3 tools/peers.py --backends flash ...
# The launch profiled is the (SKIP+1)-th whose kernel name matches KERNEL_REGEX (default
# SKIP=1: a ladder run's first launch is its check). Writes $OUT/profile/NAME.ncu-rep,
# NAME.txt (the details page) and NAME.raw.txt (every collected metric, per-opcode counts
# included). With SOURCE=1 it also samples warp stalls per instruction (SourceCounters) and
# writes NAME.sass.csv (the source page: each SASS instruction with its executions and stall
# samples; tools/stalls.py ranks them). Environment: OUT (default ./out), SKIP, SOURCE.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,17p' "$0"
  exit 2
fi
name=$1 kernel=$2
shift 2
dir=${OUT:-out}/profile
mkdir -p "$dir"
sections=(SpeedOfLight ComputeWorkloadAnalysis InstructionStats SchedulerStats WarpStateStats
  Occupancy LaunchStats MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables)
args=()
[ "${SOURCE:-0}" = 1 ] && sections+=(SourceCounters)
for s in "${sections[@]}"; do args+=(--section "$s"); done
ncu --clock-control none --target-processes all -k "regex:$kernel" --launch-skip "${SKIP:-1}" \
  --launch-count 1 "${args[@]}" -f -o "$dir/$name" "$@" >"$dir/$name.log" 2>&1 ||
  { tail -20 "$dir/$name.log"; exit 1; }
ncu --import "$dir/$name.ncu-rep" --page details >"$dir/$name.txt"
ncu --import "$dir/$name.ncu-rep" --page raw --print-metric-instances details \
  >"$dir/$name.raw.txt" 2>&1 ||
  ncu --import "$dir/$name.ncu-rep" --page raw >"$dir/$name.raw.txt"
if [ "${SOURCE:-0}" = 1 ]; then
  ncu --import "$dir/$name.ncu-rep" --page source --print-source sass --csv >"$dir/$name.sass.csv" ||
    echo "profile.sh: ncu wrote no source page for $name (its message is above)" >&2
fi
grep -E "^  [A-Za-z_].*\(|Duration|Issue Slots Busy|Executed Ipc Active|Registers Per Thread" \
  "$dir/$name.txt" | head -8
