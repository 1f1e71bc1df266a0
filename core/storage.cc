#include "core/storage.h"

#include "core/allocator.h"
#include "core/error.h"

namespace dtr {

Storage::Storage(size_t nbytes, Device device) : Storage(nbytes, allocator_for(device)) {}

Storage::Storage(size_t nbytes, Allocator& allocator) {
  void* data = allocator.allocate(nbytes);  // may throw: nothing to undo yet
  impl_ = std::make_shared<Impl>();
  impl_->device = allocator.device();
  impl_->allocator = &allocator;
  impl_->data = data;
  impl_->nbytes = nbytes;
}

Storage::Impl::~Impl() {
  if (data != nullptr) allocator->deallocate(data, nbytes);
}

void* Storage::data() const {
  DTR_CHECK(impl_ != nullptr, ValueError, "storage: access to an undefined tensor's data");
  DTR_CHECK(!impl_->released, ValueError,
            "storage: access to released memory on {}; allocate() it again before use "
            "(FSDP gathers a parameter before its module runs)",
            impl_->device);
  return impl_->data;
}

void Storage::release() {
  DTR_CHECK(impl_ != nullptr, ValueError, "storage: release() of an undefined storage");
  impl_->allocator->deallocate(impl_->data, impl_->nbytes);
  impl_->data = nullptr;
  impl_->nbytes = 0;
  impl_->released = true;
}

void Storage::allocate(size_t nbytes) {
  DTR_CHECK(impl_ != nullptr, ValueError, "storage: allocate() of an undefined storage");
  Allocator& a = *impl_->allocator;
  a.deallocate(impl_->data, impl_->nbytes);
  impl_->data = nullptr;
  impl_->nbytes = 0;
  impl_->data = a.allocate(nbytes);
  impl_->nbytes = nbytes;
  impl_->released = false;
}

}  // namespace dtr
