#include "npy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
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
#include "publish.hpp"

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

// The header dict as NumPy writes and reads it (numpy.lib.format: a Python literal that
// ast.literal_eval turns into a dict of exactly 'descr' (a string), 'fortran_order' (True or
// False) and 'shape' (a tuple of non-negative ints; one element needs its comma)), followed
// only by padding and the newline. Anything else is refused, with where it went wrong.
struct HeaderDict {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : t_(text) {}

  // Empty on success, else what is wrong.
  std::string parse(HeaderDict& out) {
    try {
      skip();
      expect('{');
      bool have_descr = false, have_order = false, have_shape = false;
      skip();
      while (peek() != '}') {
        const std::string key = string_literal();
        skip();
        expect(':');
        skip();
        auto once = [&](bool& seen) {
          if (seen) fail("the key '" + key + "' appears twice");
          seen = true;
        };
        if (key == "descr") {
          once(have_descr);
          out.descr = string_literal();
        } else if (key == "fortran_order") {
          once(have_order);
          out.fortran_order = boolean();
        } else if (key == "shape") {
          once(have_shape);
          out.shape = tuple();
        } else {
          fail("unexpected key '" + key +
               "' (a .npy header has only 'descr', 'fortran_order' "
               "and 'shape')");
        }
        skip();
        if (peek() == ',') {
          ++i_;
          skip();
        } else if (peek() != '}') {
          fail("expected ',' or '}'");
        }
      }
      ++i_;
      if (!have_descr || !have_order || !have_shape)
        fail(std::string("the header lacks ") + (!have_descr   ? "'descr'"
                                                 : !have_order ? "'fortran_order'"
                                                               : "'shape'"));
      for (; i_ < t_.size(); ++i_)
        if (t_[i_] != ' ' && t_[i_] != '\t' && t_[i_] != '\n' && t_[i_] != '\r')
          fail("text after the header's closing '}'");
      return "";
    } catch (const std::string& why) {
      return why;
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw "malformed header: " + why + " (at byte " + std::to_string(i_) + " of the header)";
  }
  char peek() const {
    if (i_ >= t_.size()) fail("it ends too early");
    return t_[i_];
  }
  void skip() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted key or string");
    const size_t end = t_.find(q, i_ + 1);
    if (end == std::string::npos) fail("an unterminated string");
    std::string v = t_.substr(i_ + 1, end - i_ - 1);
    if (v.find_first_of("\\\n") != std::string::npos) fail("a string with an escape or newline");
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    for (const char* word : {"True", "False"}) {
      const size_t n = std::strlen(word);
      if (t_.compare(i_, n, word) == 0 &&
          (i_ + n >= t_.size() || !std::isalnum(static_cast<unsigned char>(t_[i_ + n])))) {
        i_ += n;
        return word[0] == 'T';
      }
    }
    fail("'fortran_order' must be True or False");
  }
  std::vector<int64_t> tuple() {
    if (peek() != '(') fail("'shape' must be a tuple, (n, ...)");
    ++i_;
    std::vector<int64_t> v;
    bool comma_after_last = false;
    skip();
    while (peek() != ')') {
      const size_t start = i_;
      while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) ++i_;
      const std::string digits = t_.substr(start, i_ - start);
      if (digits.empty()) fail("a shape entry must be a whole number >= 0");
      if (digits.size() > 1 && digits[0] == '0') fail("a shape entry with a leading zero");
      errno = 0;
      const long long x = std::strtoll(digits.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("a shape entry does not fit in 64 bits");
      v.push_back(x);
      skip();
      comma_after_last = peek() == ',';
      if (comma_after_last) {
        ++i_;
        skip();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in the shape");
      }
    }
    ++i_;
    if (v.size() == 1 && !comma_after_last)
      fail("a one-element shape is written (n,): (n) is a number, not a tuple");
    return v;
  }

  const std::string& t_;
  size_t i_ = 0;
};

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
  HeaderDict dict;
  if (const std::string why = HeaderParser(header).parse(dict); !why.empty()) bad(path, why, kind);
  h.descr = dict.descr;
  if (!parse_descr(h.descr, kind, h.elem_bytes, h.floating))
    bad(path, "dtype '" + h.descr + "' is not supported", kind);
  if (dict.fortran_order) bad(path, "Fortran-ordered arrays are not supported", kind);
  int64_t n = 1;
  for (int64_t v : dict.shape) {
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

void write_npy_files(const std::string& dir,
                     const std::vector<std::pair<std::string, const Tensor*>>& files, bool as_f64,
                     const std::vector<std::string>& stale) {
  FolderPublisher folder(dir, stale, "saving to " + dir);
  for (const auto& [name, tensor] : files) folder.stage("", name, npy_bytes(*tensor, as_f64));
  folder.publish();
}

}  // namespace ladder
