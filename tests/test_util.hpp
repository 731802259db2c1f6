// Helpers shared by the unit tests: a scratch directory and a problem in one line.
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "problem.hpp"

namespace ladder::testing {

// A fresh directory, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "ladder_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// A problem of the given shape (float64 unless the caller changes p.dtype).
inline Problem problem(int64_t b, int64_t h, int64_t hkv, int64_t m, int64_t n, int64_t d,
                       bool causal, uint64_t seed = 1, double scale = 0) {
  Problem p;
  p.batch = b;
  p.heads = h;
  p.heads_kv = hkv;
  p.seq_q = m;
  p.seq_k = n;
  p.dim = d;
  p.causal = causal;
  p.seed = seed;
  p.scale = scale;
  p.dtype = DType::f64;
  return p;
}

}  // namespace ladder::testing
