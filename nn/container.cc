#include "nn/container.h"

#include "core/error.h"

namespace dtr::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (std::shared_ptr<Module>& m : modules) append(std::move(m));
}

void Sequential::append(std::shared_ptr<Module> module) { register_module(std::to_string(size_++), std::move(module)); }

Values Sequential::forward(const Values& inputs) {
  Values x = inputs;
  for (auto& [name, child] : named_children()) x = (*child)(std::move(x));
  return x;
}

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (std::shared_ptr<Module>& m : modules) append(std::move(m));
}

void ModuleList::append(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Module& ModuleList::operator[](size_t i) const {
  DTR_CHECK(i < modules_.size(), IndexError, "ModuleList: index {} is out of range for {} modules", i, modules_.size());
  return *modules_[i];
}

Values ModuleList::forward(const Values&) {
  throw ValueError("ModuleList: a ModuleList has no forward; call its modules");
}

ModuleDict::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<Module>>> modules) : Module("ModuleDict") {
  for (auto& [key, m] : modules) insert(key, std::move(m));
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  register_module(key, std::move(module));
}

Values ModuleDict::forward(const Values&) {
  throw ValueError("ModuleDict: a ModuleDict has no forward; call its modules");
}

}  // namespace dtr::nn
