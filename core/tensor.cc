#include "core/tensor.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/check_writable.h"
#include "core/cpu/copy.h"
#include "core/cuda/copy_bytes.h"
#include "core/cuda/cuda_device.h"
#include "core/cuda/fill_copy.h"
#include "core/cuda/stream.h"
#include "core/cuda_map_layout.h"
#include "core/trace.h"

namespace dtr {

int64_t shape_numel(std::span<const int64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Shape contiguous_strides(std::span<const int64_t> shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    s[d] = acc;
    acc *= std::max<int64_t>(shape[d], 1);
  }
  return s;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  DTR_CHECK(dim >= lo && dim <= hi, IndexError,
            "{}: dim {} out of range for a {}-d tensor (expected a dim in [{}, {}])", op, dim, ndim, lo, hi);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return fmt::format("{}{}{}", t.dtype(), t.shape(), t.device().is_cpu() ? "" : " on " + t.device().str());
}

Shape broadcast_shapes(std::span<const int64_t> a, std::span<const int64_t> b, std::string_view op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DTR_CHECK(da == db || da == 1 || db == 1, ValueError,
              "{}: shapes {} and {} do not broadcast (dim {} has sizes {} and {}; sizes must match or be 1)", op, a, b,
              i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor::Tensor(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  DTR_CHECK(shape_.size() == strides_.size(), ValueError,
            "Tensor: shape {} has {} dims but strides {} has {}; give one stride per dim", shape_, shape_.size(),
            strides_, strides_.size());
}

namespace {

// A new contiguous tensor in page-locked host memory for copies on cuda:device.
Tensor pinned_empty(const Shape& shape, DType dtype, int device, std::string_view op) {
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * itemsize(dtype);
  return Tensor(Storage(nbytes, pinned_host_allocator(device, op)), shape, contiguous_strides(shape), 0, dtype);
}

// Whether a transfer can move t's bytes as they are: pinned, contiguous, of shape and dtype.
bool dense_pinned(const Tensor& t, const Shape& shape, DType dtype) {
  return t.is_pinned() && t.is_contiguous() && t.shape() == shape && t.dtype() == dtype;
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    DTR_CHECK(s >= 0, ValueError, "empty: negative size in shape {}", shape);
  }
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtr::itemsize(dtype);
  Shape strides = contiguous_strides(shape);
  return Tensor(Storage(nbytes, device), std::move(shape), std::move(strides), 0, dtype);
}

int64_t Tensor::size(int64_t d) const { return shape_[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides_[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    if (shape_[d] == 0) return true;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

void* Tensor::data() const {
  DTR_CHECK(defined(), ValueError, "data(): the tensor is undefined");
  return static_cast<char*>(storage_.data()) + offset_ * static_cast<int64_t>(itemsize());
}

Tensor Tensor::as_strided(Shape shape, Shape strides, int64_t offset) const {
  DTR_CHECK(shape.size() == strides.size(), ValueError, "as_strided: shape {} and strides {} differ in length", shape,
            strides);
  return Tensor(storage_, std::move(shape), std::move(strides), offset, dtype_);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  DTR_CHECK(dim() > 0, IndexError, "narrow: cannot narrow a 0-d tensor");
  DTR_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], IndexError,
            "narrow: start {} + length {} exceeds size {} of dim {} of {}", start, length, shape_[d], d,
            describe(*this));
  Shape shape = shape_;
  shape[d] = length;
  return Tensor(storage_, std::move(shape), strides_, offset_ + start * strides_[d], dtype_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  DTR_CHECK(step > 0, ValueError, "slice: step must be positive, got {}", step);
  const int64_t n = shape_[d];
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape shape = shape_, strides = strides_;
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return Tensor(storage_, std::move(shape), std::move(strides), offset_ + start * strides_[d], dtype_);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  DTR_CHECK(dim() > 0, IndexError, "select: cannot select from a 0-d tensor");
  d = wrap_dim(d, dim(), "select");
  DTR_CHECK(index >= -shape_[d] && index < shape_[d], IndexError,
            "select: index {} out of range for dim {} of size {} in {}", index, d, shape_[d], describe(*this));
  if (index < 0) index += shape_[d];
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_ + index * strides_[d], dtype_);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  Shape shape = shape_, strides = strides_;
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::t() const {
  DTR_CHECK(dim() == 2, ValueError, "t: expects a 2-d tensor, got {}", describe(*this));
  return transpose(0, 1);
}

Tensor Tensor::permute(std::span<const int64_t> dims) const {
  DTR_CHECK(static_cast<int64_t>(dims.size()) == dim(), ValueError,
            "permute: {} dims given for {}; a permutation of all {} dims is needed", dims.size(), describe(*this),
            dim());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    DTR_CHECK(!seen[d], ValueError, "permute: dim {} repeated in {}", d, std::vector(dims.begin(), dims.end()));
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Shape infer_shape(Shape shape, int64_t numel, std::string_view op) {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      DTR_CHECK(infer < 0, ValueError, "{}: only one dim may be -1 in {}", op, shape);
      infer = static_cast<int64_t>(i);
    } else {
      DTR_CHECK(shape[i] >= 0, ValueError, "{}: invalid size {} in {}", op, shape[i], shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    DTR_CHECK(known != 0 && numel % known == 0, ValueError, "{}: shape {} is invalid for a tensor of {} elements", op,
              shape, numel);
    shape[infer] = numel / known;
  }
  DTR_CHECK(shape_numel(shape) == numel, ValueError, "{}: shape {} is invalid for a tensor of {} elements", op, shape,
            numel);
  return shape;
}

namespace {

// Strides that view `t` with `shape` without a copy, or empty when none exist
// (ATen's computeStride: each group of old dims that merges into new dims must be
// contiguous within itself).
std::optional<Shape> view_strides(const Tensor& t, const Shape& shape) {
  if (t.numel() == 0) return contiguous_strides(shape);
  Shape out(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = t.dim() ? t.strides().back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    tensor_numel *= t.size(d);
    if (d == 0 || (t.size(d - 1) != 1 && t.stride(d - 1) != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = t.stride(d - 1);
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace

Tensor Tensor::view(Shape shape) const {
  shape = infer_shape(std::move(shape), numel(), "view");
  auto strides = view_strides(*this, shape);
  DTR_CHECK(strides.has_value(), ValueError,
            "view: {} with strides {} cannot be viewed as {} without a copy; use reshape() or contiguous()",
            describe(*this), strides_, shape);
  return Tensor(storage_, std::move(shape), std::move(*strides), offset_, dtype_);
}

Tensor Tensor::reshape(Shape shape) const {
  shape = infer_shape(std::move(shape), numel(), "reshape");
  if (auto strides = view_strides(*this, shape)) {
    return Tensor(storage_, std::move(shape), std::move(*strides), offset_, dtype_);
  }
  return contiguous().view(std::move(shape));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return view({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  DTR_CHECK(start_dim <= end_dim, ValueError, "flatten: start_dim {} > end_dim {}", start_dim, end_dim);
  Shape shape(shape_.begin(), shape_.begin() + start_dim);
  shape.push_back(shape_numel(std::span(shape_).subspan(start_dim, end_dim - start_dim + 1)));
  shape.insert(shape.end(), shape_.begin() + end_dim + 1, shape_.end());
  return reshape(std::move(shape));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = shape_, strides = strides_;
  const int64_t s = d < dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, s);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape_[d] != 1) return *this;
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::expand(Shape shape) const {
  DTR_CHECK(static_cast<int64_t>(shape.size()) >= dim(), ValueError, "expand: target shape {} has fewer dims than {}",
            shape, describe(*this));
  const int64_t lead = static_cast<int64_t>(shape.size()) - dim();
  Shape strides(shape.size(), 0);
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < lead) {
      DTR_CHECK(shape[i] >= 0, ValueError, "expand: new leading dim {} cannot be {} in {}", i, shape[i], shape);
      continue;
    }
    const int64_t own = shape_[i - lead];
    if (shape[i] == -1) shape[i] = own;
    DTR_CHECK(own == shape[i] || own == 1, ValueError,
              "expand: {} cannot expand to {} (dim {} has size {}; only size-1 dims expand)", describe(*this), shape, i,
              own);
    strides[i] = own == shape[i] ? strides_[i - lead] : 0;
  }
  return Tensor(storage_, std::move(shape), std::move(strides), offset_, dtype_);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device, bool non_blocking) const {
  if (device == this->device()) return *this;
  Tensor out = empty(shape_, dtype_, device);
  out.copy_(*this, non_blocking);
  return out;
}

Tensor Tensor::pin_memory(int device) const {
  DTR_CHECK(defined() && this->device().is_cpu(), ValueError, "pin_memory: {} is on {}; only CPU tensors are pinned",
            describe(*this), this->device());
  if (is_pinned()) return *this;
  Tensor out = pinned_empty(shape_, dtype_, device, "pin_memory");
  cpu::copy(out, *this);
  return out;
}

bool Tensor::is_pinned() const {
  return defined() && device().is_cpu() && dynamic_cast<CachingAllocator*>(storage_.allocator()) != nullptr;
}

void Tensor::record_stream(const cuda::Stream& stream) const {
  auto* cache = defined() ? dynamic_cast<CachingAllocator*>(storage_.allocator()) : nullptr;
  DTR_CHECK(cache != nullptr, ValueError,
            "record_stream: {} is neither on a CUDA device nor pinned; only memory of a caching allocator has "
            "streams to record",
            describe(*this));
  cache->record_stream(storage_.data(), reinterpret_cast<DeviceMemory::StreamId>(stream.handle()));
}

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  DTR_CHECK(defined() && src.defined(), ValueError, "copy_: {} <- {}: both tensors must be defined", describe(*this),
            describe(src));
  Shape b = broadcast_shapes(shape_, src.shape(), "copy_");
  DTR_CHECK(b == shape_, ValueError, "copy_: source {} does not broadcast to destination {}", describe(src),
            describe(*this));
  internal::check_writable("copy_", *this);
  if (numel() == 0) return *this;
  const trace::Span span("copy_", trace::Category::kKernel);
  if (device().is_cpu() && src.device().is_cpu()) {
    cpu::copy(*this, src);
    return *this;
  }
  // CUDA: transfers between host and device move dense bytes, through page-locked staging
  // unless the host side already is dense pinned memory (and through a dense device tensor
  // when the device side is a view); device copies take any layout.
  if (device().is_cpu()) {  // device -> host
    const int dev = src.device().index;
    const cuda::Stream& stream = cuda::current_stream(dev);
    const Tensor dense = src.is_contiguous() && src.shape() == shape_ ? src : src.expand(shape_).contiguous();
    const bool direct = dense_pinned(*this, shape_, src.dtype());
    const Tensor staging = direct ? *this : pinned_empty(shape_, src.dtype(), dev, "copy_");
    const bool queued = direct && non_blocking;
    cuda::copy_bytes(staging.data(), dense.data(), dense.nbytes(), cuda::CopyKind::kDeviceToHost, stream,
                     queued ? cuda::HostWait::kNo : cuda::HostWait::kYes);
    if (queued) staging.record_stream(stream);
    if (!direct) cpu::copy(*this, staging);
    return *this;
  }
  const int dev = device().index;
  const cuda::Stream& stream = cuda::current_stream(dev);
  if (src.device().is_cpu()) {  // host -> device
    const bool direct = dense_pinned(src, shape_, dtype_);
    Tensor staging = direct ? src : pinned_empty(shape_, dtype_, dev, "copy_");
    if (!direct) cpu::copy(staging, src);
    Tensor dense = is_contiguous() ? *this : empty(shape_, dtype_, device());
    // Private staging needs no wait: the block is reserved until the copy has run.
    const bool queued = !direct || non_blocking;
    cuda::copy_bytes(dense.data(), staging.data(), nbytes(), cuda::CopyKind::kHostToDevice, stream,
                     queued ? cuda::HostWait::kNo : cuda::HostWait::kYes);
    if (queued) staging.record_stream(stream);
    if (!is_contiguous()) copy_(dense);
    return *this;
  }
  DTR_CHECK(src.device() == device(), NotImplementedError,
            "copy_: {} <- {}: copies between two CUDA devices go through the host: .to(kCPU) first", describe(*this),
            describe(src));
  cuda::copy(internal::map_operand(*this, shape_), dtype_, internal::map_operand(src, shape_), src.dtype(),
             internal::map_shape("copy_", shape_), dev, stream.handle());
  return *this;
}

double Tensor::item() const {
  DTR_CHECK(numel() == 1, ValueError, "item: {} has {} elements; item() needs exactly one", describe(*this), numel());
  Tensor host = to(kCPU).to(kFloat64).contiguous();
  return *host.data_ptr<double>();
}

namespace {

void print_elements(std::ostream& os, const Tensor& t, int64_t d, const double* base, const Shape& strides,
                    int indent) {
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dim
  const int64_t n = t.size(d);
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * kEdge && i == kEdge) {
      os << (d + 1 == t.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdge;
    }
    if (d + 1 == t.dim()) {
      os << fmt::format("{:.6g}", base[i * strides[d]]);
    } else {
      print_elements(os, t, d + 1, base + i * strides[d], strides, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(";
  if (storage_.is_released()) {
    os << "<released>";
  } else {
    Tensor host = to(kCPU).to(kFloat64).contiguous();
    if (dim() == 0) {
      os << fmt::format("{:.6g}", *host.data_ptr<double>());
    } else {
      print_elements(os, host, 0, host.data_ptr<double>(), host.strides(), 7);
    }
  }
  os << ", " << describe(*this) << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace dtr
