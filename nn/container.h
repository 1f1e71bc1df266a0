// Containers: Sequential, ModuleList and ModuleDict (torch.nn's), whose children are named
// "0", "1", ... (or by key) so state-dict names match PyTorch's ("ffn.0.weight").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace dtr::nn {

// Runs its children in order, each one's outputs the next one's inputs.
class Sequential : public Module {
 public:
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules = {});
  void append(std::shared_ptr<Module> module);
  size_t size() const { return size_; }
  using Module::operator();
  DTensor operator()(const DTensor& x) { return Module::operator()(Values{x}).at(0); }

 protected:
  Values forward(const Values& inputs) override;

 private:
  size_t size_ = 0;
};

// Holds modules by index; it has no forward of its own (calling it is a ValueError).
class ModuleList : public Module {
 public:
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules = {});
  void append(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) const;
  template <class M>
  M& at(size_t i) const {
    return dynamic_cast<M&>((*this)[i]);
  }

 protected:
  Values forward(const Values& inputs) override;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Holds modules by name, in insertion order; no forward either.
class ModuleDict : public Module {
 public:
  explicit ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>> modules = {});
  void insert(const std::string& key, std::shared_ptr<Module> module);
  Module& operator[](const std::string& key) { return child(key); }

 protected:
  Values forward(const Values& inputs) override;
};

}  // namespace dtr::nn
