#include "optim/optimizer.h"

#include <algorithm>

#include "kernels/error.h"

namespace dtr::optim {

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups)
    : name_(std::move(name)), groups_(std::move(groups)) {
  DTR_CHECK(!groups_.empty(), ValueError, "{}: no parameter groups given", name_);
  std::vector<DTensor*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    DTR_CHECK(!group.params.empty(), ValueError, "{}: parameter group {} has no parameters", name_, g);
    DTR_CHECK(group.lr >= 0 && group.weight_decay >= 0 && group.eps >= 0 && group.momentum >= 0, ValueError,
              "{}: parameter group {}: lr {}, weight_decay {}, eps {} and momentum {} must be non-negative", name_, g,
              group.lr, group.weight_decay, group.eps, group.momentum);
    DTR_CHECK(group.beta1 >= 0 && group.beta1 < 1 && group.beta2 >= 0 && group.beta2 < 1, ValueError,
              "{}: parameter group {}: betas ({}, {}) must be in [0, 1)", name_, g, group.beta1, group.beta2);
    for (DTensor* p : group.params) {
      DTR_CHECK(p != nullptr && p->defined() && p->is_leaf() && p->requires_grad(), ValueError,
                "{}: parameter group {} holds {}, not a leaf that requires grad", name_, g,
                p != nullptr && p->defined() ? p->to_string() : "an undefined tensor");
      DTR_CHECK(std::none_of(seen.begin(), seen.end(), [&](const DTensor* q) { return q->is_same(*p); }), ValueError,
                "{}: parameter {} appears twice (a parameter belongs to one group once)", name_, p->to_string());
      seen.push_back(p);
    }
  }
  state_.resize(seen.size());
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_) {
    for (DTensor* p : group.params) p->set_grad(DTensor());
  }
}

}  // namespace dtr::optim
