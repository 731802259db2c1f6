// How much host memory a run may use before it must refuse (exit 2) instead of dying in an
// allocation: the kernel's MemAvailable, or less where a limit says so: the cgroup's remaining
// limit, or the process's own (`ulimit -v`, `ulimit -d`) less what it already maps.
// $LADDER_HOST_MEMORY (a whole number of bytes) overrides them all, for machines whose memory
// grows on demand; any other value of it (empty, `abc`, `-5`, `1e999`) is refused (BadInput).
#pragma once
#include <string>

namespace ladder {

struct HostMemory {
  double bytes;        // +inf when nothing says
  std::string source;  // what set it, e.g. "MemAvailable", "the address-space limit (ulimit -v)"
};

HostMemory host_memory();
double available_host_bytes();

// Every entry point's first step: throws BadInput for an invalid $LADDER_HOST_MEMORY; under an
// address-space limit (ulimit -v), where every thread's stack counts whole from its start,
// caps the OpenMP threads to those whose stacks fit in a quarter of the room left (libgomp ends
// the process when it cannot create one) and keeps malloc to one arena (each reserves 64 MiB).
void prepare_host_memory();

// What a run estimated it needs (require_host_memory records it), for the message of an
// allocation that failed all the same: "out of host memory: ... needed about X GiB, Y GiB
// available (...)".
void note_host_estimate(double bytes);
std::string out_of_memory_message();

}  // namespace ladder
