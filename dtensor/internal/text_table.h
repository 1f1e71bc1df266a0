// TextTable: rows of cells printed as an aligned plain-text table, columns separated by
// " | " and padded to their widest cell (the layout of nccl-tests' and the explainer's
// tables). The first row is the header; lines carry no trailing spaces.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace dtr::internal {

inline std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += " | ";
      line += row[c];
      if (c + 1 < row.size()) line.append(widths[c] - row[c].size(), ' ');
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace dtr::internal
