#include "collectives/all_gather_json.h"

#include <cstring>

#include "collectives/process_group.h"
#include "core/error.h"
#include "core/tensor.h"

namespace dtr {

std::vector<nlohmann::json> all_gather_json(ProcessGroup* group, const nlohmann::json& mine) {
  if (group == nullptr) return {mine};
  const Device device = group->device();
  // Invalid UTF-8 (a path in an error message) is replaced, never thrown: a rank throwing
  // here alone would leave the others in the all-gather.
  const std::string text = mine.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const int64_t length = static_cast<int64_t>(text.size()), words = (length + 7) / 8;
  const int world = group->size();

  Tensor my_length = Tensor::from_vector(std::vector<int64_t>{length}).to(device);
  Tensor lengths = Tensor::empty({world}, kInt64, device);
  group->all_gather_into_tensor(lengths, my_length).wait();
  lengths = lengths.to(kCPU);
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = (lengths.data_ptr<int64_t>()[r] + 7) / 8;

  std::vector<int64_t> packed(static_cast<size_t>(words), 0);
  std::memcpy(packed.data(), text.data(), text.size());
  Tensor input = Tensor::from_vector(packed, {words}).to(device);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor output = Tensor::empty({total}, kInt64, device);
  group->all_gather_v(output, input, counts).wait();
  output = output.to(kCPU);

  std::vector<nlohmann::json> out;
  const char* bytes = static_cast<const char*>(output.data());
  int64_t word = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t n = lengths.data_ptr<int64_t>()[r];
    try {
      out.push_back(nlohmann::json::parse(bytes + word * 8, bytes + word * 8 + n));
    } catch (const nlohmann::json::exception& e) {
      DTR_INTERNAL_ASSERT(false, "rank {}'s gathered JSON does not parse: {}", r, e.what());
    }
    word += counts[r];
  }
  return out;
}

}  // namespace dtr
