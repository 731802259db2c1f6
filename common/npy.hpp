// NumPy .npy files: float32 or float64, C order, in; float32 (or float64) out.
// Reading validates everything (magic, header, dtype, order, size) and throws
// BadInput with the reason; nothing is ever half-read into a Tensor.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tensor.hpp"

namespace ladder {

Tensor read_npy(const std::string& path);

// Serialises a tensor to .npy bytes (float32 unless as_f64).
std::string npy_bytes(const Tensor& t, bool as_f64 = false);

// Writes several files so that either all appear or none does: each is written to a
// temporary name in the same directory first, then all are renamed into place.
// Creates `dir` if missing. Throws BadInput on failure (and removes the temporaries).
void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files,
                     bool as_f64 = false);

}  // namespace ladder
