#include "memory.hpp"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace ladder {

namespace {
// The first number in a file, or -1.
double read_number(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return *end == '\0' ? v : -1;
}

double mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return -1;
}
}  // namespace

double available_host_bytes() {
  if (const char* env = std::getenv("LADDER_HOST_MEMORY"); env && *env) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (*end == '\0' && v > 0) return v;
  }
  double avail = mem_available();
  // cgroup v2, then v1: a container's limit may be far below the machine's memory.
  for (const auto& [limit_path, usage_path] :
       {std::pair<const char*, const char*>{"/sys/fs/cgroup/memory.max",
                                            "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double limit = read_number(limit_path), usage = read_number(usage_path);
    if (limit > 0 && usage >= 0 && limit < 1e18) {
      const double left = limit - usage;
      if (avail < 0 || left < avail) avail = left;
      break;
    }
  }
  return avail < 0 ? std::numeric_limits<double>::infinity() : avail;
}

}  // namespace ladder
