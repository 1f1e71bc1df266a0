// Storage: the memory behind one or more tensors (views share it).
//
// A Storage is a shared handle: copies refer to the same bytes. Its identity survives
// release() and allocate(): FSDP frees a gathered parameter after forward (release, the
// allocator's bytes_in_use falls) and refills the same storage before backward, so every
// tensor and autograd record that holds it sees the new bytes (FSDP2 resizes to zero and
// back). Reading a released storage is an error, not garbage.
#pragma once

#include <cstddef>
#include <memory>

#include "core/device.h"

namespace dtr {

class Allocator;

class Storage {
 public:
  Storage() = default;
  // nbytes from the device's allocator (allocator_for(device)).
  Storage(size_t nbytes, Device device);
  // nbytes from `allocator` (pinned host memory: pinned_host_allocator()), which serves
  // every later allocate() too.
  Storage(size_t nbytes, Allocator& allocator);

  void* data() const;  // throws ValueError if the storage was released
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->device : Device{}; }
  // The allocator the bytes come from (nullptr for an undefined storage).
  Allocator* allocator() const { return impl_ ? impl_->allocator : nullptr; }
  bool defined() const { return impl_ != nullptr; }
  bool is_released() const { return impl_ && impl_->released; }
  // The same underlying storage (not merely equal bytes).
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }
  // Whether another handle (a tensor or view on the same storage) holds it too.
  bool is_shared() const { return impl_.use_count() > 1; }

  // Frees the bytes; every tensor on this storage stays valid but unreadable until allocate().
  void release();
  // Gives the storage nbytes of fresh (uninitialised) memory; releases any it held.
  void allocate(size_t nbytes);

 private:
  struct Impl {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device;
    Allocator* allocator = nullptr;
    bool released = false;
    ~Impl();
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace dtr
