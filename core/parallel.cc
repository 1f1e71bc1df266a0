#include "core/parallel.h"

#include <atomic>

#include "core/error.h"

namespace dtr {
namespace {

std::atomic<int> g_num_threads{1};

}  // namespace

void set_num_threads(int n) {
  DTR_CHECK(n >= 1, ValueError, "set_num_threads: got {}; the thread count must be at least 1", n);
  g_num_threads.store(n);
}

int num_threads() { return g_num_threads.load(); }

}  // namespace dtr
