// Reading back what dtr's SVG writers drew, for their tests.
#pragma once

#include <regex>
#include <string>
#include <vector>

namespace dtr::testing {

// The texts of the <text class="{cls}"> elements of `svg`, in order.
inline std::vector<std::string> texts_of_class(const std::string& svg, const std::string& cls) {
  const std::regex element("<text class=\"" + cls + "\"[^>]*>([^<]*)</text>");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), element); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1].str());
  }
  return out;
}

}  // namespace dtr::testing
