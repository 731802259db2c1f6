#include "npy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "error.hpp"
#include "files.hpp"
#include "problem.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why, NpyKind kind) {
  throw BadInput(path + ": " + why +
                 (kind == NpyKind::floats
                      ? " (expected a NumPy .npy file of float32 or float64, C order, "
                        "little-endian)"
                      : " (expected a NumPy .npy block mask of bool or integers 0/1, C order)"));
}

// Finds `'key':` in the header dict and returns the text after it.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path,
                       NpyKind kind) {
  const std::string k = "'" + key + "'";
  size_t p = header.find(k);
  if (p == std::string::npos) bad(path, "header has no " + k, kind);
  p = header.find(':', p + k.size());
  if (p == std::string::npos) bad(path, "malformed header", kind);
  return header.substr(p + 1);
}

// The dtypes a file may hold: element size and whether it is a float.
bool parse_descr(const std::string& d, NpyKind kind, int& bytes, bool& floating) {
  if (d.size() < 3) return false;
  const char order = d[0], type = d[1];
  const std::string size = d.substr(2);
  if (order != '<' && order != '=' && order != '|') return false;
  if (size != "1" && size != "2" && size != "4" && size != "8") return false;
  bytes = std::stoi(size);
  if (bytes > 1 && order == '|') return false;  // multi-byte data must say its byte order
  floating = type == 'f';
  if (kind == NpyKind::floats) return floating && (bytes == 4 || bytes == 8);
  return type == 'b' ? bytes == 1 : (type == 'u' || type == 'i');
}

}  // namespace

NpyHeader read_npy_header(const std::string& path, NpyKind kind) {
  require_regular_file(path, "reading");
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, std::string("cannot open for reading: ") + std::strerror(errno), kind);
  char pre[12] = {};
  f.read(pre, 10);
  if (f.gcount() < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    bad(path, "not a .npy file (bad magic)", kind);
  const int major = uint8_t(pre[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = uint8_t(pre[8]) | (size_t(uint8_t(pre[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    f.read(pre + 10, 2);
    if (f.gcount() < 2) bad(path, "truncated header", kind);
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(pre[8 + i])) << (8 * i);
    offset = 12;
  } else {
    bad(path, "unsupported .npy version " + std::to_string(major), kind);
  }
  if (header_len > (size_t(1) << 20)) bad(path, "header longer than 1 MiB", kind);
  std::string header(header_len, '\0');
  f.read(header.data(), std::streamsize(header_len));
  if (size_t(f.gcount()) < header_len) bad(path, "truncated header", kind);

  NpyHeader h;
  std::string descr = dict_value(header, "descr", path, kind);
  const size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) bad(path, "malformed descr", kind);
  h.descr = descr.substr(q1 + 1, q2 - q1 - 1);
  if (!parse_descr(h.descr, kind, h.elem_bytes, h.floating))
    bad(path, "dtype '" + h.descr + "' is not supported", kind);

  const std::string order = dict_value(header, "fortran_order", path, kind);
  const size_t false_at = order.find("False"), true_at = order.find("True");
  if (false_at == std::string::npos || (true_at != std::string::npos && true_at < false_at))
    bad(path, "Fortran-ordered arrays are not supported", kind);

  std::string shape_txt = dict_value(header, "shape", path, kind);
  const size_t a = shape_txt.find('('), b = shape_txt.find(')');
  if (a == std::string::npos || b == std::string::npos || b < a) bad(path, "malformed shape", kind);
  shape_txt = shape_txt.substr(a + 1, b - a - 1);
  std::stringstream ss(shape_txt);
  std::string tok;
  int64_t n = 1;
  while (std::getline(ss, tok, ',')) {
    const size_t s = tok.find_first_not_of(" \t"), e = tok.find_last_not_of(" \t");
    if (s == std::string::npos) continue;
    tok = tok.substr(s, e - s + 1);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || errno == ERANGE)
      bad(path, "malformed shape entry '" + tok + "'", kind);
    n = checked_mul(n, v);
    if (n < 0 || checked_mul(n, h.elem_bytes) < 0) bad(path, "shape is too large", kind);
    h.shape.push_back(v);
  }
  h.data_offset = offset + header_len;
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) bad(path, "cannot read its size: " + ec.message(), kind);
  const uintmax_t need = uintmax_t(n) * uintmax_t(h.elem_bytes), have = size - h.data_offset;
  if (size < h.data_offset || have < need)
    bad(path,
        "truncated: the shape needs " + std::to_string(need) + " data bytes, the file has " +
            std::to_string(size < h.data_offset ? 0 : have),
        kind);
  if (have > need) bad(path, "trailing bytes after the data", kind);
  return h;
}

Tensor read_npy(const std::string& path, const NpyHeader& h) {
  const NpyKind kind = h.floating ? NpyKind::floats : NpyKind::mask;
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot open for reading", kind);
  f.seekg(std::streamoff(h.data_offset));
  Tensor t(h.shape);
  // Read in chunks straight into the tensor: memory is the tensor plus one chunk.
  const size_t n = size_t(h.numel()), per_chunk = (size_t(1) << 20) / size_t(h.elem_bytes);
  std::vector<char> buf(per_chunk * size_t(h.elem_bytes));
  for (size_t done = 0; done < n;) {
    const size_t m = std::min(per_chunk, n - done);
    f.read(buf.data(), std::streamsize(m * size_t(h.elem_bytes)));
    if (size_t(f.gcount()) != m * size_t(h.elem_bytes)) bad(path, "short read", kind);
    for (size_t i = 0; i < m; ++i) {
      const char* p = buf.data() + i * size_t(h.elem_bytes);
      double x = 0;
      if (h.floating) {
        if (h.elem_bytes == 4) {
          float v;
          std::memcpy(&v, p, 4);
          x = v;
        } else {
          std::memcpy(&x, p, 8);
        }
      } else {  // a mask: any integer type, little-endian; every value must be 0 or 1
        uint64_t u = 0;
        std::memcpy(&u, p, size_t(h.elem_bytes));
        if (u > 1)
          bad(path, "a block mask holds only 0 and 1 (found " + std::to_string(u) + ")", kind);
        x = double(u);
      }
      t.data[done + i] = x;
    }
    done += m;
  }
  return t;
}

Tensor read_npy(const std::string& path, NpyKind kind) {
  return read_npy(path, read_npy_header(path, kind));
}

std::string npy_bytes(const Tensor& t, bool as_f64) {
  std::ostringstream h;
  h << "{'descr': '" << (as_f64 ? "<f8" : "<f4") << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape.size(); ++i)
    h << t.shape[i] << (t.shape.size() == 1 ? "," : i + 1 < t.shape.size() ? ", " : "");
  h << "), }";
  std::string header = h.str();
  // Pad with spaces so the data starts on a 64-byte boundary; end with a newline.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out.push_back(char(header.size() & 0xff));
  out.push_back(char((header.size() >> 8) & 0xff));
  out += header;
  const size_t elem = as_f64 ? 8 : 4;
  const size_t start = out.size();
  out.resize(start + t.data.size() * elem);
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (as_f64) {
      std::memcpy(&out[start + i * 8], &t.data[i], 8);
    } else {
      const float v = float(t.data[i]);
      std::memcpy(&out[start + i * 4], &v, 4);
    }
  }
  return out;
}

NpyWriteSet::~NpyWriteSet() {
  if (!committed_) roll_back_staging();
}

void NpyWriteSet::roll_back_staging() {
  std::error_code ec;
  for (const File& f : files_) fs::remove(f.tmp, ec);
  for (auto d = created_dirs_.rbegin(); d != created_dirs_.rend(); ++d)
    fs::remove(*d, ec);  // only folders this set created, and only when empty
  files_.clear();
  created_dirs_.clear();
}

void NpyWriteSet::stage(const std::string& dir, const std::string& name, const Tensor& t,
                        bool as_f64) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw BadInput(dir + ": exists and is not a directory");
  // The folders this set creates, deepest last: a failed set removes them again (if empty).
  std::vector<std::string> fresh;
  for (fs::path d = fs::absolute(dir, ec); !d.empty() && !fs::exists(d, ec); d = d.parent_path())
    fresh.insert(fresh.begin(), d.string());
  created_dirs_.insert(created_dirs_.end(), fresh.begin(), fresh.end());
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw BadInput(dir + ": cannot create the output directory");
  File f;
  f.final_path = (fs::path(dir) / name).string();
  if (fs::is_directory(f.final_path, ec))
    throw BadInput(f.final_path + ": is a directory; nothing was written");
  int fd = -1;
  f.tmp = create_unique_file(dir, name, fd);
  files_.push_back(f);  // from here on the destructor removes it
  const bool ok = write_all(fd, npy_bytes(t, as_f64));
  const int saved = errno;
  const bool closed = ::close(fd) == 0;
  if (!ok || !closed)
    throw BadInput(f.final_path + ": cannot write: " + std::strerror(ok ? errno : saved) +
                   "; nothing was written");
  if (std::find(dirs_.begin(), dirs_.end(), dir) == dirs_.end()) dirs_.push_back(dir);
}

void NpyWriteSet::commit(const std::vector<std::string>& stale) {
  std::error_code ec;
  // What the set replaces or removes is first renamed aside, so a failure can put it back.
  std::vector<std::pair<std::string, std::string>> aside;  // original path, backup path
  auto move_aside = [&](const std::string& path) {
    if (!fs::exists(fs::symlink_status(path, ec))) return;
    int fd = -1;
    const fs::path p(path);
    const std::string backup =
        create_unique_file(p.parent_path().string(), p.filename().string() + ".old", fd);
    ::close(fd);
    fs::rename(path, backup, ec);
    if (ec) {
      fs::remove(backup, ec);
      throw BadInput(path + ": cannot replace it: " + ec.message());
    }
    aside.push_back({path, backup});
  };
  std::vector<const File*> placed;
  auto roll_back = [&] {
    for (const File* f : placed) fs::rename(f->final_path, f->tmp, ec);
    for (auto it = aside.rbegin(); it != aside.rend(); ++it) fs::rename(it->second, it->first, ec);
    roll_back_staging();
  };
  try {
    for (const File& f : files_) move_aside(f.final_path);
    for (const std::string& dir : dirs_)
      for (const std::string& name : stale) {
        const std::string path = (fs::path(dir) / name).string();
        const bool written = std::any_of(files_.begin(), files_.end(),
                                         [&](const File& f) { return f.final_path == path; });
        if (!written) move_aside(path);
      }
    for (const File& f : files_) {
      fs::rename(f.tmp, f.final_path, ec);
      if (ec) throw BadInput(f.final_path + ": cannot rename into place: " + ec.message());
      placed.push_back(&f);
    }
  } catch (...) {
    roll_back();
    committed_ = true;  // the temporaries are gone
    throw;
  }
  committed_ = true;
  for (const auto& a : aside) fs::remove(a.second, ec);
}

void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files, bool as_f64,
                     const std::vector<std::string>& stale) {
  NpyWriteSet set;
  for (const auto& [name, tensor] : files) set.stage(dir, name, *tensor, as_f64);
  set.commit(stale);
}

}  // namespace ladder
