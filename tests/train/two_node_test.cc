// The train program on two real nodes: two network namespaces joined by a veth pair, one
// dtrrun launcher in each (--nnodes 2 --nproc-per-node 2: node 0 runs ranks 0 and 1, node 1
// ranks 2 and 3), Gloo between them over the veth (GLOO_SOCKET_IFNAME names each node's end).
// The 4 ranks' losses equal those of 4 ranks on one node for 10 steps (float32, 1e-5 relative).
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`. Where the namespaces or
// the veth pair cannot be made, the test case prints the warning "SKIPPED: <why>" and returns;
// tools/count_catch2.py counts it as skipped, neither passed nor failed. The namespaces are
// deleted on every way out of the test case (VethPair), and ones a killed earlier run left
// behind (their pid gone) are deleted first.
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/train/train_runner.h"

namespace dtr {
namespace {

namespace fs = std::filesystem;

using testing::kDtrrun;
using testing::kTrain;
using Result = testing::CommandResult;
using testing::read_file;
const std::string& kTiny = testing::kTinyTrainFlags;  // 12 sequences split over 4 ranks
// Namespaces are named kPrefix<pid>_<node>; the pid tells a later run whether they are stale.
const std::string kPrefix = "dtr_two_node_";
// Any port will do: node 0's namespace is fresh, nothing else listens in it.
constexpr int kMasterPort = 29500;
// A launcher that has not finished by then is stopped (SIGTERM, forwarded to its ranks).
constexpr int kLaunchTimeoutSeconds = 300;

Result run(const std::string& command, const fs::path& log) { return testing::run_command(command, log); }

fs::path fresh_dir(const std::string& name) { return testing::fresh_dir("two_node_test_" + name); }

// iproute2's `ip`: on PATH, or in an sbin that Bazel's test PATH (/bin:/usr/bin) leaves out.
std::string find_ip() {
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::stringstream dirs(path);
    for (std::string d; std::getline(dirs, d, ':');) {
      if (!d.empty() && ::access((fs::path(d) / "ip").c_str(), X_OK) == 0) return (fs::path(d) / "ip").string();
    }
  }
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Two network namespaces, one per node, joined by a veth pair: node k's end is veth[k] with
// address[k] (10.213.x.1/24 and 10.213.x.2/24), and lo is up in both. The destructor deletes
// whatever was made (deleting a namespace destroys the veth end in it, and so the pair).
class VethPair {
 public:
  VethPair(std::string ip, fs::path dir) : ip_(std::move(ip)), dir_(std::move(dir)) {
    const int pid = static_cast<int>(::getpid());
    for (int k = 0; k < 2; ++k) {
      netns_[k] = fmt::format("{}{}_{}", kPrefix, pid, k);
      veth_[k] = veth_name(pid, k);
      address_[k] = fmt::format("10.213.{}.{}", pid % 256, k + 1);
    }
  }
  VethPair(const VethPair&) = delete;
  VethPair& operator=(const VethPair&) = delete;
  ~VethPair() { remove(); }

  // Makes the namespaces and the pair. Returns why not where this machine cannot (no
  // privilege, no veth support): the test is then skipped. Later steps throw on failure.
  std::string make() {
    remove_stale();
    for (int k = 0; k < 2; ++k) {
      if (const Result r = ip(fmt::format("netns add {}", netns_[k])); r.exit_code != 0) {
        return fmt::format("cannot create a network namespace (`ip netns add` needs root or CAP_SYS_ADMIN): {}",
                           r.output);
      }
      made_netns_[k] = true;
    }
    if (const Result r = ip(fmt::format("link add {} type veth peer name {}", veth_[0], veth_[1])); r.exit_code != 0) {
      return fmt::format("cannot create a veth pair (needs CAP_NET_ADMIN and the veth driver): {}", r.output);
    }
    made_veth_ = true;
    for (int k = 0; k < 2; ++k) {
      check(fmt::format("link set {} netns {}", veth_[k], netns_[k]));
      check(fmt::format("-n {} addr add {}/24 dev {}", netns_[k], address_[k], veth_[k]));
      check(fmt::format("-n {} link set {} up", netns_[k], veth_[k]));
      check(fmt::format("-n {} link set lo up", netns_[k]));
    }
    return "";
  }

  // Deletes the namespaces (idempotent); true when `ip netns list` no longer shows them.
  bool remove() {
    for (int k = 0; k < 2; ++k) {
      if (made_netns_[k]) ip(fmt::format("netns delete {}", netns_[k]));
      made_netns_[k] = false;
    }
    if (made_veth_) ip(fmt::format("link delete {}", veth_[0]));  // still here if it never moved
    made_veth_ = false;
    const std::string list = ip("netns list").output;
    return list.find(netns_[0]) == std::string::npos && list.find(netns_[1]) == std::string::npos;
  }

  const std::string& netns(int k) const { return netns_[k]; }
  const std::string& veth(int k) const { return veth_[k]; }
  const std::string& address(int k) const { return address_[k]; }

 private:
  // At most 15 characters (IFNAMSIZ - 1): "dtr2n" + a pid of up to 7 digits + "a" or "b".
  static std::string veth_name(int pid, int k) { return fmt::format("dtr2n{}{}", pid, k == 0 ? 'a' : 'b'); }

  Result ip(const std::string& args) const { return run(fmt::format("{} {}", ip_, args), dir_ / "ip.txt"); }

  void check(const std::string& args) const {
    const Result r = ip(args);
    if (r.exit_code != 0) throw std::runtime_error(fmt::format("`ip {}` failed: {}", args, r.output));
  }

  // Namespaces (and an unmoved veth) of earlier runs whose process is gone, e.g. killed by
  // Bazel's timeout before its destructors ran.
  void remove_stale() const {
    std::stringstream list(ip("netns list").output);
    for (std::string line; std::getline(list, line);) {
      if (!line.starts_with(kPrefix)) continue;
      const std::string name = line.substr(0, line.find(' '));  // "name (id: 3)"
      const int pid = std::atoi(name.c_str() + kPrefix.size());
      if (pid <= 0 || (::kill(pid, 0) == 0 || errno != ESRCH)) continue;
      ip(fmt::format("netns delete {}", name));
      ip(fmt::format("link delete {}", veth_name(pid, 0)));
    }
  }

  std::string ip_;
  fs::path dir_;
  std::string netns_[2], veth_[2], address_[2];
  bool made_netns_[2] = {false, false};
  bool made_veth_ = false;
};

}  // namespace

TEST_CASE("train on two nodes (network namespaces joined by a veth pair) gives one node's losses", "[train]") {
  const fs::path dir = fresh_dir("run");
  const std::string ip = find_ip();
  if (ip.empty()) {
    WARN("SKIPPED: iproute2's `ip` is not installed (looked on PATH and in /usr/sbin, /sbin, /usr/bin, /bin)");
    return;
  }
  VethPair net(ip, dir);
  if (const std::string why = net.make(); !why.empty()) {
    WARN("SKIPPED: " << why);
    return;
  }

  // Both launchers at once; each node's ranks reach the other node only through the veth.
  std::vector<std::future<Result>> nodes;
  for (int k = 0; k < 2; ++k) {
    const fs::path node = dir / fmt::format("node{}", k);
    fs::create_directories(node);
    const std::string command = fmt::format(
        "timeout -k 10 {} {} netns exec {} env GLOO_SOCKET_IFNAME={} {} --nnodes 2 --node-rank {} "
        "--nproc-per-node 2 --master-addr {} --master-port {} --run-id two_node_{} {} {} --out {}",
        kLaunchTimeoutSeconds, ip, net.netns(k), net.veth(k), kDtrrun, k, net.address(0), kMasterPort, ::getpid(),
        kTrain, kTiny, (node / "out").string());
    nodes.push_back(std::async(std::launch::async, run, command, node / "output.txt"));
  }
  const Result node0 = nodes[0].get(), node1 = nodes[1].get();
  CHECK(net.remove());  // `ip netns list` no longer shows them

  const fs::path one = dir / "one_node";
  fs::create_directories(one);
  const Result reference =
      run(fmt::format("{} --nproc-per-node 4 {} {} --out {}", kDtrrun, kTrain, kTiny, (one / "out").string()),
          one / "output.txt");

  INFO("node 0:\n" << node0.output);
  INFO("node 1:\n" << node1.output);
  REQUIRE(node0.exit_code == 0);
  REQUIRE(node1.exit_code == 0);
  CHECK(node0.output.find("node 0 of 2: starting ranks 0 .. 1 of 4") != std::string::npos);
  CHECK(node1.output.find("node 1 of 2: starting ranks 2 .. 3 of 4") != std::string::npos);
  // Rank 0 lives on node 0 and alone writes the metrics.
  const fs::path metrics = dir / "node0" / "out" / "metrics.jsonl";
  REQUIRE(fs::exists(metrics));
  CHECK(!fs::exists(dir / "node1" / "out" / "metrics.jsonl"));
  const std::vector<double> two_nodes = testing::losses_in(metrics, 4);
  {
    INFO("one node:\n" << reference.output);
    REQUIRE(reference.exit_code == 0);
  }
  const std::vector<double> one_node = testing::losses_in(one / "out" / "metrics.jsonl", 4);
  REQUIRE(one_node.size() == 10);
  REQUIRE(two_nodes.size() == one_node.size());
  for (size_t s = 0; s < one_node.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(two_nodes[s] == Approx(one_node[s]).epsilon(1e-5));
  }
}

}  // namespace dtr
