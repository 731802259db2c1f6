#include "memory.hpp"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "error.hpp"
#include "tensor.hpp"

namespace ladder {

namespace {

const std::string kEnv = "LADDER_HOST_MEMORY";
double g_estimate = -1;  // the last run's estimate, bytes

// The first number in a file, or -1.
double read_number(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return *end == '\0' ? v : -1;
}

// A "Key:  123 kB" line of a /proc file, in bytes; -1 if absent.
double proc_kib(const char* path, const std::string& key) {
  std::ifstream f(path);
  std::string k, unit;
  double kib = 0;
  while (f >> k >> kib) {
    std::getline(f, unit);
    if (k == key) return kib * 1024.0;
  }
  return -1;
}

// $LADDER_HOST_MEMORY: absent (false), or a whole number of bytes >= 1; else BadInput.
bool env_override(double& bytes) {
  const char* env = std::getenv(kEnv.c_str());
  if (!env) return false;
  const std::string s = env;
  const bool digits =
      !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string::npos;
  bytes = digits ? std::strtod(s.c_str(), nullptr) : 0;
  if (digits && bytes >= 1) return true;
  const std::string form =
      "a whole number of bytes, at least 1, digits only (e.g. " + kEnv + "=17179869184 for 16 GiB)";
  throw BadInput("$" + kEnv + "='" + s +
                 "' is not accepted: it is the host memory a run may use, " + form +
                 "; unset it to use the machine's available memory");
}

void lower(HostMemory& m, double bytes, const char* source) {
  if (bytes >= 0 && bytes < m.bytes) m = {bytes, source};
}

}  // namespace

HostMemory host_memory() {
  double bytes = 0;
  if (env_override(bytes)) return {bytes, "$" + kEnv};
  HostMemory m{std::numeric_limits<double>::infinity(), "nothing limits it"};
  lower(m, proc_kib("/proc/meminfo", "MemAvailable:"), "MemAvailable");
  // cgroup v2, then v1: a container's limit may be far below the machine's memory.
  for (const auto& [limit_path, usage_path] :
       {std::pair<const char*, const char*>{"/sys/fs/cgroup/memory.max",
                                            "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double limit = read_number(limit_path), usage = read_number(usage_path);
    if (limit > 0 && usage >= 0 && limit < 1e18) {
      lower(m, limit - usage, "the cgroup's remaining limit");
      break;
    }
  }
  // The process's own limits, less what it maps already (every allocation counts whole).
  struct {
    int resource;
    const char* status_key;
    const char* source;
  } const limits[] = {{RLIMIT_AS, "VmSize:", "the address-space limit, ulimit -v"},
                      {RLIMIT_DATA, "VmData:", "the data-segment limit, ulimit -d"}};
  for (const auto& l : limits) {
    struct rlimit rl {};
    if (::getrlimit(l.resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    const double used = proc_kib("/proc/self/status", l.status_key);
    lower(m, double(rl.rlim_cur) - (used > 0 ? used : 0), l.source);
  }
  if (m.bytes < 0) m.bytes = 0;
  return m;
}

double available_host_bytes() {
  return host_memory().bytes;
}

void prepare_host_memory() {
  double bytes = 0;
  env_override(bytes);
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return;
  // Under an address-space limit the host loops run on this thread alone: OpenMP makes (and
  // may make again) its threads when a parallel region starts, and once the run's tensors have
  // taken the room a new thread's stack cannot be mapped, and libgomp ends the process ("Thread
  // creation failed", exit 1) where an allocation that fails would say how much memory was
  // needed (exit 2). One malloc arena for the same reason.
  limit_threads(1);
#ifdef __GLIBC__
  ::mallopt(M_ARENA_MAX, 1);
#endif
}

void note_host_estimate(double bytes) {
  g_estimate = bytes;
}

std::string out_of_memory_message() {
  const auto gib = [](double b) {
    std::ostringstream s;
    s.precision(2);
    s << std::fixed << b / double(1ull << 30) << " GiB";
    return s.str();
  };
  std::string msg = "out of host memory: an allocation failed";
  HostMemory m{std::numeric_limits<double>::infinity(), ""};
  try {
    m = host_memory();
  } catch (const BadInput&) {  // checked at the start: not reached
  }
  if (g_estimate > 0) msg += "; the run was estimated to need about " + gib(g_estimate);
  if (m.bytes < std::numeric_limits<double>::infinity())
    msg += std::string(g_estimate > 0 ? ", and " : "; ") + gib(m.bytes) + " are available (" +
           m.source + ")";
  return msg + ". Use a smaller problem (or --check sampled / none), or allow more memory";
}

}  // namespace ladder
