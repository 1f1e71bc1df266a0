// GlooStore: Gloo's rendezvous::Store interface over a dtr Store, so that Gloo's
// connectFullMesh exchanges its addresses through dtr's TCP store (and a group's prefix).
//
// Waits without a timeout use the dtr store's own timeout; a missing key therefore ends
// in dtr's DistributedError(kTimeout) naming it, which passes through Gloo unchanged.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives/store.h"

namespace dtr {

class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<dtr::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<dtr::Store> store_;
};

}  // namespace dtr
