#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace ladder {

void Table::print(std::ostream& os) const {
  std::vector<size_t> w(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) w[c] = header_[c].size();
  for (const auto& r : rows_)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < w.size(); ++c) {
      const std::string& s = c < r.size() ? r[c] : std::string();
      os << (c ? "  " : "");
      if (c + 1 < w.size())
        os << std::left << std::setw(int(w[c])) << s;
      else
        os << s;  // no trailing blanks after the last column
    }
    os << "\n";
  };
  line(header_);
  std::vector<std::string> rule;
  for (size_t c = 0; c < w.size(); ++c) rule.push_back(std::string(w[c], '-'));
  line(rule);
  for (const auto& r : rows_) line(r);
}

std::string fmt(double v, int precision) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(precision) << v;
  return s.str();
}

std::string fmt_sci(double v, int precision) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(precision) << v;
  return s.str();
}

std::string fmt_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
  return s.str();
}

}  // namespace ladder
