// How much host memory a run may use before it must refuse (exit 2) instead of dying in an
// allocation: the kernel's MemAvailable, or the cgroup's remaining limit when that is smaller.
// $LADDER_HOST_MEMORY (bytes) overrides both, for machines whose memory grows on demand.
#pragma once

namespace ladder {

double available_host_bytes();

}  // namespace ladder
