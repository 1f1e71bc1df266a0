// ThreadCountGuard: restores dtr's CPU thread count (core/parallel.h) when a test that
// changed it ends, so that determinism tests (1 thread vs 2) leave no state behind for
// the test cases that run after them.
#pragma once

#include "core/parallel.h"

namespace dtr::testing {

struct ThreadCountGuard {
  int saved = num_threads();
  ~ThreadCountGuard() { set_num_threads(saved); }
};

}  // namespace dtr::testing
