#include "collectives/store.h"

#include <fmt/format.h>

namespace dtr {

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += fmt::format("{}'{}'", out.empty() ? "" : ", ", k);
  return "[" + out + "]";
}

}  // namespace dtr
