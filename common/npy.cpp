#include "npy.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "error.hpp"

namespace ladder {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw BadInput(path + ": " + why +
                 " (expected a NumPy .npy file of float32 or float64, C order, "
                 "little-endian)");
}

// Finds `'key':` in the header dict and returns the text after it.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const std::string k = "'" + key + "'";
  size_t p = header.find(k);
  if (p == std::string::npos) bad(path, "header has no " + k);
  p = header.find(':', p + k.size());
  if (p == std::string::npos) bad(path, "malformed header");
  return header.substr(p + 1);
}

}  // namespace

Tensor read_npy(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw BadInput(path + ": is a directory, not a .npy file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw BadInput(path + ": cannot open for reading");
  std::string bytes;
  try {  // a read error surfaces as std::ios_base::failure from the stream buffer
    bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw BadInput(path + ": cannot read: " + e.what());
  }
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0)
    bad(path, "not a .npy file (bad magic)");
  const int major = uint8_t(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = uint8_t(bytes[8]) | (size_t(uint8_t(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(path, "truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    bad(path, "unsupported .npy version " + std::to_string(major));
  }
  if (bytes.size() < offset + header_len) bad(path, "truncated header");
  const std::string header = bytes.substr(offset, header_len);

  std::string descr = dict_value(header, "descr", path);
  size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) bad(path, "malformed descr");
  descr = descr.substr(q1 + 1, q2 - q1 - 1);
  int elem;
  if (descr == "<f4" || descr == "=f4")
    elem = 4;
  else if (descr == "<f8" || descr == "=f8")
    elem = 8;
  else
    bad(path, "dtype '" + descr + "' is not supported");

  const std::string order = dict_value(header, "fortran_order", path);
  if (order.find("False") == std::string::npos || order.find("False") > order.find(','))
    bad(path, "Fortran-ordered arrays are not supported");

  std::string shape_txt = dict_value(header, "shape", path);
  size_t a = shape_txt.find('('), b = shape_txt.find(')');
  if (a == std::string::npos || b == std::string::npos || b < a) bad(path, "malformed shape");
  shape_txt = shape_txt.substr(a + 1, b - a - 1);
  std::vector<int64_t> shape;
  std::stringstream ss(shape_txt);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    size_t s = tok.find_first_not_of(" \t"), e = tok.find_last_not_of(" \t");
    if (s == std::string::npos) continue;
    tok = tok.substr(s, e - s + 1);
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (*end != '\0' || v < 0) bad(path, "malformed shape entry '" + tok + "'");
    // The byte count must fit in 64 bits: a product that wraps could "match" no data.
    if (v > 0 && Tensor::numel(shape) > std::numeric_limits<int64_t>::max() / 8 / v)
      bad(path, "shape is too large");
    shape.push_back(v);
  }
  const int64_t n = Tensor::numel(shape);
  const size_t data_off = offset + header_len;
  const size_t need = size_t(n) * size_t(elem);
  if (bytes.size() - data_off < need)
    bad(path, "truncated: shape needs " + std::to_string(need) + " data bytes, file has " +
                  std::to_string(bytes.size() - data_off));
  if (bytes.size() - data_off > need) bad(path, "trailing bytes after the data");

  Tensor t(shape);
  const char* p = bytes.data() + data_off;
  for (int64_t i = 0; i < n; ++i) {
    if (elem == 4) {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      t.data[size_t(i)] = v;
    } else {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      t.data[size_t(i)] = v;
    }
  }
  return t;
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

void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files, bool as_f64) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw BadInput(dir + ": cannot create output directory");
  std::vector<std::pair<fs::path, fs::path>> staged;  // temporary -> final
  auto cleanup = [&] {
    for (auto& s : staged) fs::remove(s.first, ec);
  };
  for (const auto& [name, tensor] : files) {
    const fs::path final_path = fs::path(dir) / name;
    const fs::path tmp = fs::path(dir) / ("." + name + ".partial");
    staged.push_back({tmp, final_path});
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    const std::string bytes = npy_bytes(*tensor, as_f64);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.close();
    if (!f) {
      cleanup();
      throw BadInput(final_path.string() + ": cannot write");
    }
  }
  // Renaming onto a directory fails: find that before anything is put in place.
  for (auto& s : staged)
    if (fs::is_directory(s.second)) {
      cleanup();
      throw BadInput(s.second.string() + ": is a directory; nothing was written");
    }
  for (auto& s : staged) {
    fs::rename(s.first, s.second, ec);
    if (ec) {
      cleanup();
      throw BadInput(s.second.string() + ": cannot rename into place: " + ec.message());
    }
  }
}

}  // namespace ladder
