// Aligned text tables and number formatting for reports.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace ladder {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string fmt(double v, int precision = 3);      // fixed
std::string fmt_sci(double v, int precision = 2);  // scientific
std::string fmt_bytes(double bytes);               // 12.0 MiB

}  // namespace ladder
