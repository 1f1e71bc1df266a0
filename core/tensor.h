// Tensor: a local, strided view of a Storage (ATen's TensorImpl, without autograd).
//
// A tensor is (storage, shape, strides, offset, dtype); strides and offset count
// elements. Views (narrow, select, transpose, permute, view, expand, ...) share the
// storage and copy nothing; contiguous(), clone() and to() copy. Broadcast views have
// stride 0 and must not be written through. A default-constructed Tensor is undefined.
// Meshes, placements and autograd live above this layer (dtensor/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace dtr {

namespace cuda {
class Stream;
}

using Shape = std::vector<int64_t>;

int64_t shape_numel(std::span<const int64_t> shape);
Shape contiguous_strides(std::span<const int64_t> shape);
// Wraps a possibly negative dim into [0, ndim); throws IndexError naming op and shape.
int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op);
// `shape` with its one -1 (if any) resolved so that it holds `numel` elements (view and
// reshape's rule); ValueError naming op, the shape and numel when no such size exists.
Shape infer_shape(Shape shape, int64_t numel, std::string_view op);

class Tensor {
 public:
  Tensor() = default;
  // A view of `storage`; ValueError unless shape and strides have one entry per dim each.
  Tensor(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  // New uninitialised contiguous tensor.
  static Tensor empty(Shape shape, DType dtype = kFloat32, Device device = kCPU);
  // A CPU tensor holding a copy of values, viewed with shape (default: 1-D).
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape = {});

  bool defined() const { return storage_.defined(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_.device(); }
  size_t itemsize() const { return dtr::itemsize(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  const Storage& storage() const { return storage_; }
  bool is_contiguous() const;

  // Address of the first element (storage base + offset). data_ptr<T> checks T.
  void* data() const;
  template <class T>
  T* data_ptr() const;

  // --- views: no copy, shared storage ---
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(std::span<const int64_t> dims) const;
  Tensor permute(std::initializer_list<int64_t> dims) const { return permute(std::span(dims.begin(), dims.size())); }
  // view: same elements, new shape; one dim may be -1. Throws if the strides forbid it.
  Tensor view(Shape shape) const;
  // reshape: a view where legal, else a contiguous copy.
  Tensor reshape(Shape shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  // expand: broadcast size-1 dims (stride 0) and prepend new leading dims; -1 keeps a size.
  Tensor expand(Shape shape) const;
  Tensor as_strided(Shape shape, Shape strides, int64_t offset) const;

  // --- copies ---
  Tensor contiguous() const;  // this tensor if already contiguous
  Tensor clone() const;
  Tensor to(DType dtype) const;  // this tensor if the dtype already matches
  // This tensor on `device` (itself if already there); non_blocking as for copy_.
  Tensor to(Device device, bool non_blocking = false) const;
  // Copies src into this tensor (broadcasting src, converting dtype, across devices).
  // Host-to-device copies go through page-locked staging and are only queued on the
  // device's current stream (the caller's src may be changed at once); device-to-host
  // copies return once the bytes are on the host. non_blocking (torch's): between a
  // pinned host tensor and a device tensor of the same dtype and shape, both dense, the
  // copy is only queued in either direction, without staging; the caller must not touch
  // the host tensor until the stream has run it (synchronise or wait on an event). The
  // pinned block stays reserved until then even if the tensor is freed.
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  // A copy in page-locked host memory for copies on cuda:`device`'s streams (this tensor
  // if already pinned); CPU tensors only. ValueError without that CUDA device.
  Tensor pin_memory(int device = 0) const;
  // Whether the storage is page-locked host memory (pin_memory's).
  bool is_pinned() const;
  // Marks the storage as used by work queued on `stream` (torch's Tensor.record_stream):
  // once freed, its block is reused only after that work has run, so a tensor a side
  // stream reads or writes can be dropped as soon as the host is done with it. CUDA and
  // pinned tensors (their caching allocators); ValueError naming the tensor otherwise.
  void record_stream(const cuda::Stream& stream) const;

  // The single element of a one-element tensor, converted to double.
  double item() const;
  std::string to_string() const;

 private:
  Storage storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = kFloat32;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
// "float32[2, 3]": used in every error message that names a tensor.
std::string describe(const Tensor& t);

// Broadcast shape of a and b (numpy rules), or ValueError naming op and both shapes.
Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b, std::string_view op);

template <class T>
T* Tensor::data_ptr() const {
  DTR_CHECK(dtype_of<T>() == dtype_, TypeError, "data_ptr<{}>() on a {} tensor", dtype_name(dtype_of<T>()),
            describe(*this));
  return static_cast<T*>(data());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  if (shape.empty() && values.size() != 1) shape = {static_cast<int64_t>(values.size())};
  DTR_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), ValueError,
            "from_vector: {} values cannot fill shape {}", values.size(), shape);
  Tensor t = empty(std::move(shape), dtype_of<T>(), kCPU);
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return t;
}

}  // namespace dtr
