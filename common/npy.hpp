// NumPy .npy files: float32 or float64 (and, for block masks, bool/uint8/int) in C order,
// little-endian. Reading validates everything (a regular file, magic, the header by NumPy's
// grammar, dtype, order, size against the file) and throws BadInput with the reason; the header is
// read first, so the shape can be checked against the limits and the memory before the data is
// read, and the data is read straight into the tensor (no copy of the file in memory). Writing is
// all or nothing (publish.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "files.hpp"
#include "tensor.hpp"

namespace ladder {

struct NpyHeader {
  std::vector<int64_t> shape;
  std::string descr;       // e.g. "<f4"
  int elem_bytes = 0;      // 1, 2, 4 or 8
  bool floating = true;    // f4/f8; else an integer or bool mask
  size_t data_offset = 0;  // where the data starts
  int64_t numel() const { return Tensor::numel(shape); }
};

// Reads and checks the header of `path` (and that the file holds exactly the data it
// describes). `what` says which kinds are accepted: floats (f4, f8) or masks (b1, u1, i1,
// and wider integers holding 0/1).
enum class NpyKind { floats, mask };
NpyHeader read_npy_header(const std::string& path, NpyKind kind = NpyKind::floats);

// The whole file as doubles (floats: their values; masks: 0 or 1, BadInput for other values).
Tensor read_npy(const std::string& path, NpyKind kind = NpyKind::floats);
Tensor read_npy(const std::string& path, const NpyHeader& h);

// Serialises a tensor to .npy bytes (float32 unless as_f64).
std::string npy_bytes(const Tensor& t, bool as_f64 = false);

// One folder's .npy files (float32 unless as_f64), published all or none (publish.hpp): the
// folder's `stale` names that are not written (say dq.npy of an earlier backward run next to a
// forward-only save) go too, and everything else in it stays. Throws BadInput, the folder as
// it was.
void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files,
                     bool as_f64 = false, const std::vector<std::string>& stale = {});

}  // namespace ladder
