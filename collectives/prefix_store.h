// PrefixStore: a view of another Store in which every key is "<prefix>/<key>".
//
// Sub-groups and each backend's rendezvous get their own prefix, so that keys written
// by different groups never collide on the one TCP store (c10d's PrefixStore). The
// view shares the underlying store; its own timeout starts as the underlying one's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/store.h"

namespace dtr {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store)
      : Store(store->timeout()), prefix_(std::move(prefix)), store_(std::move(store)) {}

  void set(const std::string& key, std::string_view value) override { store_->set(prefixed(key), value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return store_->get(prefixed(key), timeout);
  }
  using Store::get;
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(prefixed(key), delta); }
  std::string compare_set(const std::string& key, std::string_view expected, std::string_view desired) override {
    return store_->compare_set(prefixed(key), expected, desired);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefixed(k));
    store_->wait(full, timeout);
  }
  using Store::wait;
  bool delete_key(const std::string& key) override { return store_->delete_key(prefixed(key)); }
  int64_t num_keys() override { return store_->num_keys(); }

  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefixed(const std::string& key) const { return prefix_ + "/" + key; }

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace dtr
