// NumPy .npy reading and writing (common/npy.hpp): round trips, the header layout NumPy
// expects, every kind of malformed file rejected with BadInput naming the file and the
// reason, write_npy_files' all-or-nothing promise (publish.hpp), and the results CSV's locked
// read-merge-write (csv_append.hpp).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "csv_append.hpp"
#include "error.hpp"
#include "npy.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace ladder;
using Catch::Matchers::Contains;
using ladder::testing::TempDir;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Every entry of a directory (hidden ones too), sorted.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A .npy file written by hand: `dict` is the header's Python dict literal. Version 1 has a
// 2-byte header length, version 2 a 4-byte one; the header is padded so data starts on a
// 64-byte boundary, as NumPy writes it.
std::string handmade_npy(const std::string& dict, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(char(version));
  out.push_back('\0');
  const size_t n = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  return out + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The message of the BadInput that `f` throws. Anything else fails the check (without
// ending the test case, so the cases after it still run) and returns "".
std::string bad_input_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const BadInput& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw something other than BadInput: " << e.what());
    return "";
  }
  FAIL_CHECK("did not throw");
  return "";
}

Tensor counting(std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data[size_t(i)] = 0.25 * double(i) - 3.0;
  return t;
}

}  // namespace

TEST_CASE("npy: float32 round trip for 0-d to 4-d shapes", "[npy]") {
  TempDir dir;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {5}, {3, 7}, {2, 3, 4, 5}, {3, 0}}) {
    const Tensor t = counting(shape);  // values exact in float32
    INFO("shape " << t.shape_str());
    const std::string path = dir / "t.npy";
    write_file(path, npy_bytes(t));
    const Tensor back = read_npy(path);
    CHECK(back.shape == t.shape);
    CHECK(back.data == t.data);
  }
  // Values that are not float32 come back as their float32 rounding.
  Tensor t({4});
  t.data = {0.1, -1.0 / 3.0, 1e-40, 3e38};
  write_file(dir / "r.npy", npy_bytes(t));
  const Tensor back = read_npy(dir / "r.npy");
  REQUIRE(back.numel() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(back.data[i] == double(float(t.data[i])));
}

TEST_CASE("npy: float64 round trip is exact", "[npy]") {
  TempDir dir;
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n(0.0, 1e3);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {9}, {2, 3, 5, 4}}) {
    Tensor t(shape);
    for (double& x : t.data) x = n(rng);
    INFO("shape " << t.shape_str());
    write_file(dir / "t.npy", npy_bytes(t, true));
    const Tensor back = read_npy(dir / "t.npy");
    CHECK(back.shape == t.shape);
    CHECK(back.data == t.data);  // bit-exact, not approximately
  }
}

TEST_CASE("npy: the header is what NumPy writes, data 64-byte aligned", "[npy]") {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {}, {1}, {12}, {123, 4}, {2, 3, 4, 5}, {1, 16, 1023, 128}}) {
    for (bool f64 : {false, true}) {
      Tensor t;
      t.shape = shape;  // the header only depends on the shape: no need for the data here
      const std::string b = npy_bytes(t, f64);
      INFO("shape " << t.shape_str() << (f64 ? " float64" : " float32"));
      REQUIRE(b.size() >= 10);
      CHECK(b.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)) == 0);
      const size_t hlen = uint8_t(b[8]) | (size_t(uint8_t(b[9])) << 8);
      CHECK((10 + hlen) % 64 == 0);
      REQUIRE(b.size() == 10 + hlen);  // no data was given
      const std::string header = b.substr(10);
      CHECK(header.back() == '\n');
      CHECK_THAT(header, Contains(f64 ? "'descr': '<f8'" : "'descr': '<f4'"));
      CHECK_THAT(header, Contains("'fortran_order': False"));
      std::string tuple = "(";  // Python's tuple syntax: (), (5,), (2, 3)
      for (size_t i = 0; i < shape.size(); ++i)
        tuple += std::to_string(shape[i]) + (shape.size() == 1      ? ","
                                             : i + 1 < shape.size() ? ", "
                                                                    : "");
      CHECK_THAT(header, Contains("'shape': " + tuple + ")"));
    }
  }
  // The data follows the padded header directly, 4 or 8 bytes an element.
  const Tensor t = counting({2, 3});
  for (bool f64 : {false, true}) {
    const std::string b = npy_bytes(t, f64);
    const size_t data_at = 10 + (uint8_t(b[8]) | (size_t(uint8_t(b[9])) << 8));
    CHECK(data_at % 64 == 0);
    CHECK(b.size() == data_at + 6 * (f64 ? 8 : 4));
  }
}

TEST_CASE("npy: reads version 2 (and 3) headers and NumPy's own dict layout", "[npy]") {
  TempDir dir;
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 4.0f, 0.5f, 6.0f};
  for (int version : {2, 3}) {
    INFO("version " << version);
    write_file(dir / "v.npy",
               handmade_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", raw(v),
                            version));
    const Tensor t = read_npy(dir / "v.npy");
    CHECK(t.shape == std::vector<int64_t>{2, 3});
    CHECK(t.data == std::vector<double>(v.begin(), v.end()));
  }
  // Keys in another order, '<f8', no trailing comma.
  const std::vector<double> d = {0.1, 0.2, 0.3};
  write_file(dir / "d.npy",
             handmade_npy("{'shape': (3,), 'fortran_order': False, 'descr': '<f8'}", raw(d)));
  const Tensor t = read_npy(dir / "d.npy");
  CHECK(t.shape == std::vector<int64_t>{3});
  CHECK(t.data == d);
}

TEST_CASE("npy: malformed files throw BadInput saying why", "[npy]") {
  TempDir dir;
  const std::string path = dir / "bad.npy";
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data6 = raw(std::vector<float>(6, 1.0f));
  const std::string good = handmade_npy(good_dict, data6);
  write_file(path, good);
  REQUIRE(read_npy(path).numel() == 6);  // the baseline the cases below break one way each

  // data6 under a header of these fields (null: the field left out).
  auto with_fields = [&](const char* descr, const char* fortran, const char* shape) {
    std::string dict = "{";
    if (descr) dict += std::string("'descr': ") + descr + ", ";
    if (fortran) dict += std::string("'fortran_order': ") + fortran + ", ";
    if (shape) dict += std::string("'shape': ") + shape + ", ";
    return handmade_npy(dict + "}", data6);
  };
  struct Bad {
    const char* what;
    std::string bytes;
    const char* says;
  };
  const std::vector<Bad> cases = {
      {"bad magic", "\x93NUMPX" + good.substr(6), "bad magic"},
      {"not npy at all", "hello, world\n", "bad magic"},
      {"shorter than the preamble", std::string("\x93NUMPY\x01", 7), "bad magic"},
      {"unknown version", std::string("\x93NUMPY\x09\x00", 8) + good.substr(8), "version"},
      {"truncated header", good.substr(0, 40), "truncated header"},
      {"truncated v2 length", std::string("\x93NUMPY\x02\x00\x10", 9) + "  ", "truncated header"},
      {"truncated data", good.substr(0, good.size() - 1), "truncated"},
      {"no data", good.substr(0, 64), "truncated"},
      {"trailing bytes", good + std::string(4, '\0'), "trailing bytes"},
      {"dtype <i4", with_fields("'<i4'", "False", "(2, 3)"), "'<i4'"},
      {"big-endian >f4", with_fields("'>f4'", "False", "(2, 3)"), "'>f4'"},
      {"float16 <f2", with_fields("'<f2'", "False", "(2, 6)"), "'<f2'"},
      {"fortran_order True", with_fields("'<f4'", "True", "(2, 3)"), "Fortran"},
      {"no descr", with_fields(nullptr, "False", "(2, 3)"), "descr"},
      {"no shape", with_fields("'<f4'", "False", nullptr), "shape"},
      {"shape not a tuple", with_fields("'<f4'", "False", "6"), "shape"},
      {"shape with a word", with_fields("'<f4'", "False", "(2, x)"), "shape"},
      {"negative shape", with_fields("'<f4'", "False", "(-2, -3)"), "shape"},
      {"fractional shape", with_fields("'<f4'", "False", "(1.5, 4)"), "shape"},
      // 2^32 * 2^32 elements wraps a 64-bit count to 0, which an empty data section "matches".
      {"element count overflows",
       handmade_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                    ""),
       ""},
  };
  for (const Bad& c : cases) {
    INFO(c.what);
    write_file(path, c.bytes);
    const std::string msg = bad_input_message([&] { read_npy(path); });
    CHECK_THAT(msg, Contains(c.says));
    CHECK_THAT(msg, Contains(path));  // a useful message names the file
  }
  const std::string missing = dir / "missing.npy";
  CHECK_THAT(bad_input_message([&] { read_npy(missing); }), Contains(missing));
  CHECK_THAT(bad_input_message([&] { read_npy(dir.path.string()); }), Contains(dir.path.string()));
}

TEST_CASE("npy: write_npy_files writes every file, atomically named, nothing else", "[npy]") {
  TempDir dir;
  const Tensor o = counting({1, 2, 3, 4}), lse = counting({1, 2, 3});
  const std::string out = dir / "a/b";  // missing parents are created
  write_npy_files(out, {{"o.npy", &o}, {"lse.npy", &lse}});
  CHECK(entries(out) == std::vector<std::string>{"lse.npy", "o.npy"});
  CHECK(read_npy(out + "/o.npy").data == o.data);
  CHECK(read_npy(out + "/lse.npy").shape == lse.shape);

  // Overwriting replaces the old files whole.
  const Tensor o2 = counting({2, 2});
  write_npy_files(out, {{"o.npy", &o2}}, true);
  CHECK(read_npy(out + "/o.npy").shape == o2.shape);
  CHECK(read_file(out + "/o.npy") == npy_bytes(o2, true));
  CHECK(entries(out) == std::vector<std::string>{"lse.npy", "o.npy"});
}

TEST_CASE("npy: write_npy_files is all-or-nothing", "[npy]") {
  TempDir dir;
  const Tensor o = counting({1, 1, 2, 2}), lse = counting({1, 1, 2});
  const std::vector<std::pair<std::string, const Tensor*>> files = {{"o.npy", &o},
                                                                    {"lse.npy", &lse}};

  SECTION("the target is a file") {
    const std::string target = dir / "target";
    write_file(target, "not a directory");
    CHECK_THAT(bad_input_message([&] { write_npy_files(target, files); }), Contains(target));
    CHECK(read_file(target) == "not a directory");
    CHECK(entries(dir.path) == std::vector<std::string>{"target"});  // no .partial beside it
  }
  SECTION("a parent of the target is a file") {
    write_file(dir / "file", "x");
    const std::string target = dir / "file/sub";
    CHECK_THAT(bad_input_message([&] { write_npy_files(target, files); }), Contains(target));
    CHECK(entries(dir.path) == std::vector<std::string>{"file"});
  }
  SECTION("a later file cannot be put in place: the earlier ones must not appear either") {
    const std::string out = dir / "out";
    fs::create_directories(out + "/lse.npy/keep");  // a directory where lse.npy should go
    const std::string msg = bad_input_message([&] { write_npy_files(out, files); });
    CHECK_THAT(msg, Contains("lse.npy"));
    CHECK(entries(out) == std::vector<std::string>{"lse.npy"});  // no o.npy, no .partial
    CHECK(fs::is_directory(out + "/lse.npy/keep"));              // and nothing of ours removed
  }
}

TEST_CASE("npy: a save replaces the folder whole, keeping every other entry", "[npy]") {
  TempDir dir;
  const Tensor o = counting({1, 1, 2, 2}), lse = counting({1, 1, 2});
  const std::string out = dir / "out";
  fs::create_directories(out + "/sub/deeper");
  write_file(out + "/sub/deeper/f.txt", "mine");
  write_file(out + "/dq.npy", "stale");
  fs::create_symlink("sub", out + "/link");
  // A staging folder that a killed save left (nothing holds its lock), one that a live save
  // holds, and names that only look like staging.
  const std::string dead = dir / ".out.ladder-save.0123456789abcdef",
                    live = dir / ".out.ladder-save.fedcba9876543210";
  fs::create_directories(dead + "/sub");
  fs::create_directories(live);
  fs::create_directories(dir / ".out.ladder-save.notmine");
  fs::create_directories(dir / ".other.ladder-save.0123456789abcdef");
  const int held = ::open(live.c_str(), O_RDONLY);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  write_npy_files(out, {{"o.npy", &o}, {"lse.npy", &lse}}, false, {"dq.npy"});
  ::close(held);
  CHECK(entries(out) == std::vector<std::string>{"link", "lse.npy", "o.npy", "sub"});
  CHECK(read_file(out + "/sub/deeper/f.txt") == "mine");
  CHECK(fs::read_symlink(out + "/link") == "sub");
  CHECK(read_file(out + "/o.npy") == npy_bytes(o));
  CHECK(entries(dir.path) == std::vector<std::string>{".other.ladder-save.0123456789abcdef",
                                                      ".out.ladder-save.fedcba9876543210",
                                                      ".out.ladder-save.notmine", "out"});
}

TEST_CASE("npy: appenders of one CSV that began together keep each other's rows", "[npy]") {
  TempDir dir;
  const std::string csv = dir / "r.csv";
  // The old writer read the file when it began and wrote that back with its rows: the writer
  // that finished last dropped the other's.
  CsvAppender a(csv, "h", nullptr), b(csv, "h", nullptr);
  a.add("1");
  b.add("2");
  CHECK(a.append() == "added 1 row to " + csv + " (a new file, 1 in all)");
  CHECK(b.append() == "added 1 row to " + csv + " (2 in all)");
  CHECK(read_file(csv) == "h\n1\n2\n");
  CHECK(entries(dir.path) == std::vector<std::string>{"r.csv"});  // no lock file, no temporary

  // Not the header (or a byte-order mark before it), checked at the start and again under the
  // lock: refused, the file as it was.
  CsvAppender c(csv, "h", nullptr);
  write_file(csv, "\xEF\xBB\xBFh\n1\n");
  c.add("3");
  CHECK_THAT(bad_input_message([&] { c.append(); }), Contains("byte-order mark"));
  CHECK(read_file(csv) == "\xEF\xBB\xBFh\n1\n");
  CHECK_THAT(bad_input_message([&] { CsvAppender(csv, "h", nullptr); }), Contains("byte-order"));
  write_file(csv, "x\n");
  CHECK_THAT(bad_input_message([&] { CsvAppender(csv, "h", nullptr); }), Contains("header is"));
  // A link or a FIFO is never written through.
  fs::create_symlink("r.csv", dir / "link.csv");
  CHECK_THAT(bad_input_message([&] { CsvAppender(dir / "link.csv", "h", nullptr); }),
             Contains("symbolic link"));
  REQUIRE(::mkfifo((dir / "fifo.csv").c_str(), 0644) == 0);
  CHECK_THAT(bad_input_message([&] { CsvAppender(dir / "fifo.csv", "h", nullptr); }),
             Contains("FIFO"));
}
