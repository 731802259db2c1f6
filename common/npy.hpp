// NumPy .npy files: float32 or float64 (and, for block masks, bool/uint8/int) in C order,
// little-endian. Reading validates everything (a regular file, magic, the header by NumPy's
// grammar, dtype, order, size against the file) and throws BadInput with the reason; the header is
// read first, so the shape can be checked against the limits and the memory before the data is
// read, and the data is read straight into the tensor (no copy of the file in memory). Writing is
// all or nothing.
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

// A set of .npy files, possibly in several folders, written all or nothing: stage() writes
// each to a fresh temporary name in its folder (created if missing), commit() moves them all
// into place. Files the set replaces are kept aside until every rename has succeeded, so a
// failure leaves every folder as it was; `stale` names in a folder that this set does not write
// (say dq.npy of an earlier backward run next to a forward-only save) are removed on commit, so
// that afterwards the folder's output files are exactly this set. On failure only what this
// object created is deleted (its temporaries, and folders it made that are still empty).
// Throws BadInput on failure.
class NpyWriteSet {
 public:
  NpyWriteSet() = default;
  NpyWriteSet(const NpyWriteSet&) = delete;
  NpyWriteSet& operator=(const NpyWriteSet&) = delete;
  ~NpyWriteSet();  // removes the temporaries of an uncommitted set
  void stage(const std::string& dir, const std::string& name, const Tensor& t, bool as_f64);
  // A folder this set writes nothing to but whose `stale` names commit() removes too (the
  // step folder of an earlier `ladder compare --save` that this one did not run). The folder
  // itself is left. Nothing happens to a folder that does not exist.
  void clear(const std::string& dir);
  // `stale`: names (e.g. "dq.npy") to remove from each staged (or cleared) folder if this set
  // does not write them there. Concurrent commits into one folder take turns (flock).
  void commit(const std::vector<std::string>& stale = {});

 private:
  struct File {
    std::string tmp, final_path, backup;
  };
  void roll_back_staging();  // removes the temporaries and the folders this set created
  std::vector<File> files_;
  std::vector<std::string> dirs_, created_dirs_;
  bool committed_ = false;
};

// One folder's files, all or none (an NpyWriteSet of one folder).
void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files,
                     bool as_f64 = false, const std::vector<std::string>& stale = {});

}  // namespace ladder
