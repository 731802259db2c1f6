#include "csv_append.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "error.hpp"
#include "files.hpp"

namespace ladder {

namespace fs = std::filesystem;

namespace {

const std::string kBom = "\xEF\xBB\xBF";

// The rows of a CSV text: its non-empty lines after the header.
size_t count_rows(const std::string& text) {
  size_t rows = 0, start = text.find('\n');
  while (start != std::string::npos && start + 1 < text.size()) {
    const size_t end = text.find('\n', start + 1);
    const size_t len = (end == std::string::npos ? text.size() : end) - start - 1;
    rows += len > 0 && !(len == 1 && text[start + 1] == '\r');
    start = end;
  }
  return rows;
}

// Temporaries beside `path` that a killed writer left (write_file_atomically's names,
// `.<name>.<16 hex>`): every writer holds the folder's lock while its temporary exists, so one
// seen under the lock is stale.
void remove_stale_temporaries(const std::string& folder, const std::string& name) {
  const std::string head = "." + name + ".";
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() == head.size() + 16 && n.compare(0, head.size(), head) == 0 &&
        std::all_of(n.begin() + long(head.size()), n.end(),
                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }) &&
        it->symlink_status(ec).type() == fs::file_type::regular)
      stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
}

}  // namespace

CsvAppender::CsvAppender(std::string path, std::string header, CsvHeaderCheck check,
                         std::string flag)
    : path_(std::move(path)),
      header_(std::move(header)),
      flag_(std::move(flag)),
      check_(std::move(check)) {
  if (path_.empty()) return;
  require_replaceable(path_, flag_);  // a FIFO, device, folder or link is never written
  std::error_code ec;
  if (!fs::is_regular_file(path_, ec) || fs::file_size(path_, ec) == 0) return;  // a new file
  std::ifstream in(path_, std::ios::binary);
  std::string first;
  if (!std::getline(in, first)) throw BadInput(flag_ + " " + path_ + ": cannot read the file");
  first_line_of(first + "\n");  // checks it
}

void CsvAppender::add(const std::string& row) {
  rows_ += row + "\n";
  ++pending_;
}

// The header check of a file's text (non-empty): returns its first line.
std::string CsvAppender::first_line_of(const std::string& text) const {
  std::string first = text.substr(0, text.find('\n'));
  if (!first.empty() && first.back() == '\r') first.pop_back();
  if (first.compare(0, kBom.size(), kBom) == 0)
    throw BadInput(flag_ + " " + path_ +
                   ": the file starts with a UTF-8 byte-order mark (the bytes EF BB BF) before "
                   "its header, which the results files never have; remove those three bytes");
  if (check_)
    check_(first);
  else if (first != header_)
    throw BadInput(flag_ + " " + path_ + ": the file's header is\n  " + first + "\nnot\n  " +
                   header_);
  return first;
}

std::string CsvAppender::read_current() const {
  std::error_code ec;
  const fs::file_type type = fs::symlink_status(path_, ec).type();
  if (type == fs::file_type::not_found) return "";
  require_replaceable(path_, flag_);  // became a link or FIFO meanwhile: refused
  std::ifstream in(path_, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad() || !in.is_open()) throw BadInput(flag_ + " " + path_ + ": cannot read the file");
  if (text.empty()) return "";
  first_line_of(text);
  if (text.back() != '\n') text += "\n";  // else the first new row would join its last line
  return text;
}

std::string CsvAppender::append() {
  if (path_.empty()) return "";
  const fs::path p(path_);
  const std::string folder = p.has_parent_path() ? p.parent_path().string() : ".";
  std::error_code ec;
  fs::create_directories(folder, ec);  // a missing folder is made, as for any output
  const FolderLock lock(folder);
  remove_stale_temporaries(folder, p.filename().string());
  const std::string old = read_current();
  const std::string text = (old.empty() ? header_ + "\n" : old) + rows_;
  write_file_atomically(path_, text, flag_ + " " + path_);
  created_ = created_ || old.empty();
  added_ += pending_;
  rows_.clear();
  pending_ = 0;
  return "added " + std::to_string(added_) + (added_ == 1 ? " row" : " rows") + " to " + path_ +
         " (" + (created_ ? "a new file, " : "") + std::to_string(count_rows(text)) + " in all)";
}

}  // namespace ladder
