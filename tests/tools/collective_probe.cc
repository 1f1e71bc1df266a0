// What launcher_test starts as ranks to check that dtrrun's world really communicates:
//   collective_probe all_reduce          every rank all-reduces (rank + 1) and prints the sum
//   collective_probe die_in_collective R rank R SIGKILLs itself while the others are inside
//                                        a stream of large all_reduces
// Any error exits 1 with the message on stderr (the launcher prefixes it with the rank).
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "collectives/init.h"
#include "kernels/fill.h"

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    auto world = dtr::init_process_group(dtr::Backend::kGloo);
    if (mode == "all_reduce") {
      dtr::Tensor t = dtr::full({4}, world->rank() + 1.0, dtr::kFloat64);
      world->all_reduce(t).wait();
      std::cout << "all_reduce sum " << t.narrow(0, 0, 1).item() << " of " << world->size() << " ranks\n";
      return 0;
    }
    if (mode == "die_in_collective" && argc > 2) {
      dtr::set_default_timeout(std::chrono::seconds(20));
      world->set_timeout(std::chrono::seconds(20));
      const int victim = std::atoi(argv[2]);
      dtr::Tensor big = dtr::zeros({1 << 22}, dtr::kFloat32);  // 16 MiB: each all_reduce takes a while
      for (int i = 0;; ++i) {
        dtr::Work w = world->all_reduce(big);
        if (world->rank() == victim && i == 3) ::raise(SIGKILL);
        w.wait();
      }
    }
    std::cerr << "collective_probe: unknown mode '" << mode << "'\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "collective_probe: " << e.what() << "\n";
    return 1;
  }
}
