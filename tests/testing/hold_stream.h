// hold(stream, ms): queues a host function that sleeps `ms` milliseconds on `stream`, so
// that work queued after it waits: the GPU tests' way to show that the host did not.
#pragma once

#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "core/cuda/stream.h"

namespace dtr::testing {

inline void hold(const cuda::Stream& stream, int ms) {
  auto* wait = new int(ms);
  REQUIRE(cudaLaunchHostFunc(
              stream.handle(),
              [](void* arg) {
                std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(arg)));
                delete static_cast<int*>(arg);
              },
              wait) == cudaSuccess);
}

}  // namespace dtr::testing
