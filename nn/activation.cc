#include "nn/activation.h"

#include "core/error.h"
#include "dtensor/ops/dropout.h"
#include "nn/init.h"

namespace dtr::nn {

Dropout::Dropout(double p) : UnaryModule("Dropout"), p_(p) {
  DTR_CHECK(p >= 0.0 && p <= 1.0, ValueError, "Dropout: probability {} is not in [0, 1]", p);
}

std::string Dropout::extra_repr() const { return fmt::format("p={}, inplace=False", p_); }

DTensor Dropout::forward(const DTensor& x) { return training() && p_ > 0.0 ? dropout(x, p_, next_seed()) : x; }

}  // namespace dtr::nn
