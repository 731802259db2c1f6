#!/usr/bin/env bash
# The stand-in for a test this build cannot run (tests/CMakeLists.txt, ladder_not_run): says
# why and exits 77, which ctest reports as "Skipped" and lists under "did not run", never as
# passed.
#   not_run.sh REASON...
echo "NOT RUN: $*"
exit 77
