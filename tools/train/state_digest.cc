#include "tools/train/state_digest.h"

#include <string_view>

namespace dtr::train {
namespace {

// FNV-1a, 64 bits.
struct Fnv1a {
  uint64_t value = 14695981039346656037ULL;
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) value = (value ^ p[i]) * 1099511628211ULL;
  }
  void add(std::string_view text) { add(text.data(), text.size()); }
  // The whole tensor (gathered on every rank), row-major.
  void add(const DTensor& t) {
    const Tensor whole = t.full_tensor().to(kCPU).contiguous();
    add(whole.data(), whole.nbytes());
  }
};

}  // namespace

uint64_t state_digest(nn::Module& model, const optim::Optimizer& optimizer) {
  Fnv1a h;
  for (const auto& [name, p] : model.named_parameters()) {
    h.add(name);
    h.add(*p);
  }
  for (const auto& [index, param] : optimizer.state_dict().state) {
    h.add(&param.step, sizeof(param.step));
    for (const auto& [name, t] : param.tensors) {
      h.add(name);
      h.add(t);
    }
  }
  return h.value;
}

}  // namespace dtr::train
