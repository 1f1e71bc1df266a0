#include "collectives/process_group.h"

#include <numeric>

#include "collectives/distributed_error.h"
#include "core/units.h"

namespace dtr {
namespace {

// t as a 1-D tensor on the same memory (t must be contiguous).
Tensor flat_view(const Tensor& t) { return t.as_strided({t.numel()}, {1}, t.offset()); }

// Copies src's elements into dst in row-major order; shapes may differ, counts may not.
void copy_elements(const Tensor& dst, const Tensor& src) {
  Tensor d = dst;
  if (d.is_contiguous()) {
    d.view(src.shape()).copy_(src);
  } else {
    d.copy_(src.contiguous().view(d.shape()));
  }
}

// A flat buffer standing for t: t's own memory when contiguous, else a fresh buffer
// (staged) that pack/unpack copy through.
struct Flat {
  Tensor buffer;
  bool staged = false;
};

Flat flat_for(const Tensor& t) {
  if (t.is_contiguous()) return {flat_view(t), false};
  return {Tensor::empty({t.numel()}, t.dtype(), t.device()), true};
}

Shape row_shape(const Tensor& t) { return Shape(t.shape().begin() + 1, t.shape().end()); }

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

std::string describe_all(const std::vector<Tensor>& ts) {
  std::string s;
  for (const Tensor& t : ts) s += (s.empty() ? "" : ", ") + describe(t);
  return "[" + s + "]";
}

// Whether t's first element sits exactly at element `offset` of the flat buffer.
bool sits_at(const Tensor& t, const Tensor& flat, int64_t offset) {
  return t.is_contiguous() && t.storage().is_same(flat.storage()) && t.offset() == flat.offset() + offset;
}

// Block sizes in elements from row counts.
std::vector<int64_t> elements_of(const std::vector<int64_t>& rows, int64_t row_numel) {
  std::vector<int64_t> e(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) e[i] = rows[i] * row_numel;
  return e;
}

// Checks a per-rank count vector of a "_v" call: one non-negative entry per rank.
void check_counts(std::string_view call, std::string_view what, const std::vector<int64_t>& counts, int size,
                  const std::string& group) {
  DTR_CHECK(static_cast<int>(counts.size()) == size, ValueError,
            "{}: {} has {} entries {}, but group '{}' has {} ranks (one count of dim-0 rows per rank)", call, what,
            counts.size(), counts, group, size);
  for (int64_t c : counts) {
    DTR_CHECK(c >= 0, ValueError, "{}: {} {} holds a negative count", call, what, counts);
  }
}

void check_rows(std::string_view call, const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() >= 1 && b.dim() >= 1 && row_shape(a) == row_shape(b), ValueError,
            "{}: {} and {} must have at least one dim and the same sizes after dim 0 (counts are dim-0 rows)", call,
            describe(a), describe(b));
}

// The group ranks whose key (made by key_of) is not in the store.
template <class KeyOf>
std::vector<int> ranks_missing(Store& store, int size, KeyOf key_of) {
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    try {
      store.get(key_of(r), std::chrono::milliseconds(0));
    } catch (const DistributedError& e) {
      if (e.kind() != DistributedErrorKind::kTimeout) throw;
      missing.push_back(r);
    }
  }
  return missing;
}

}  // namespace

int64_t Collective::offset_of(const std::vector<int64_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
}

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size, GroupOptions options)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      timeout_ms_(options_.timeout.count()) {
  DTR_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError,
            "process group '{}': rank {} is not in [0, {}) for a group of {} ranks", options_.name, rank, size, size);
  if (options_.global_ranks.empty()) {
    options_.global_ranks.resize(size);
    std::iota(options_.global_ranks.begin(), options_.global_ranks.end(), 0);
  }
  DTR_CHECK(static_cast<int>(options_.global_ranks.size()) == size, ValueError,
            "process group '{}': {} global ranks {} for a group of {} ranks", options_.name,
            options_.global_ranks.size(), options_.global_ranks, size);
}

void ProcessGroup::join_ranks() {
  auto key_of = [](int r) { return fmt::format("joined/{}", r); };
  store_->set(key_of(rank_), "");
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(key_of(r));
  try {
    store_->wait(keys, timeout());
  } catch (const DistributedError& e) {
    if (e.kind() != DistributedErrorKind::kTimeout) throw;
    const std::vector<int> missing = ranks_missing(*store_, size_, key_of);
    throw DistributedError(
        DistributedErrorKind::kTimeout,
        fmt::format("{} group '{}' (rank {} of {}): group rank(s) {} (global rank(s) {}) did not join within {} ms; "
                    "every rank must create the group (init_process_group, new_group and split_group are "
                    "collective: call them in the same order on every rank)",
                    backend_name(), name(), rank_, size_, missing, global_of(missing), timeout().count()));
  }
}

std::string ProcessGroup::diagnose_failure(uint64_t seq) {
  auto key_of = [&](int r) { return fmt::format("failed/{}/{}", seq, r); };
  const auto grace = std::min<std::chrono::milliseconds>(timeout() / 2, std::chrono::seconds(1));
  try {
    store_->set(key_of(rank_), "");
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(key_of(r));
    try {
      store_->wait(keys, grace);
      return "every rank of the group saw it fail";
    } catch (const DistributedError& e) {
      if (e.kind() != DistributedErrorKind::kTimeout) throw;
    }
    const std::vector<int> missing = ranks_missing(*store_, size_, key_of);
    return fmt::format(
        "peer group rank(s) {} (global {}) did not report this failure within {} ms: dead, hung, or "
        "in another collective",
        missing, global_of(missing), grace.count());
  } catch (const std::exception& e) {
    return fmt::format("the store could not say which peers are alive ({})", e.what());
  }
}

std::vector<int> ProcessGroup::global_of(const std::vector<int>& ranks) const {
  std::vector<int> g;
  for (int r : ranks) g.push_back(options_.global_ranks[r]);
  return g;
}

Collective ProcessGroup::begin(CollectiveKind kind, std::string_view call, DType dtype, std::string signature,
                               const std::vector<const Tensor*>& tensors) {
  for (const Tensor* t : tensors) {
    DTR_CHECK(t->defined(), ValueError, "{}: got an undefined tensor in {}", call, signature);
  }
  DTR_CHECK(dtype != kBool, TypeError,
            "{}: {} has dtype bool; collectives move float32, float64, bfloat16, float16, int32 or int64 "
            "(convert bool to int32 first)",
            call, signature);
  for (const Tensor* t : tensors) {
    DTR_CHECK(t->dtype() == dtype, TypeError, "{}: every tensor must have one dtype; got {}", call, signature);
    DTR_CHECK(accepts(t->device()), TypeError,
              "{}: group '{}' uses the {} backend, which moves {} tensors; got {} (use a group of the "
              "backend for that device)",
              call, name(), backend_name(), accepted_devices(), describe(*t));
  }
  Collective c;
  c.kind = kind;
  c.call = std::string(call);
  c.dtype = dtype;
  c.description = std::move(signature);
  return c;
}

Work ProcessGroup::issue(Collective c) {
  c.seq = next_seq_.fetch_add(1);
  c.description = fmt::format("{} #{} on group '{}' (rank {} of {}, {}) of {}", c.call, c.seq, name(), rank_, size_,
                              backend_name(), c.description);
  c.group = name();
  c.group_size = size_;
  collective_counter().record(c.kind, name(), c.bytes);
  trace::Span span(c.call, trace::Category::kIssue);
  if (!span.active()) return enqueue(std::move(c));
  c.phase = trace::current_comm_phase();
  c.owner = trace::current_comm_owner();
  c.trace_args(span);
  return enqueue(std::move(c));
}

static void check_reduce_op(std::string_view call, ReduceOp op, DType dtype) {
  DTR_CHECK(op != ReduceOp::kAvg || is_floating(dtype), TypeError,
            "{}: ReduceOp avg needs a floating dtype (float32, float64, bfloat16, float16); got {} "
            "(use sum and divide, or convert first)",
            call, dtype);
}

Work ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  Collective c =
      begin(CollectiveKind::kAllReduce, "all_reduce", tensor.dtype(),
            fmt::format("{} ({}, {})", describe(tensor), reduce_op_name(op), format_bytes(tensor.nbytes())), {&tensor});
  check_reduce_op(c.call, op, c.dtype);
  Flat f = flat_for(tensor);
  c.op = op;
  c.input = c.output = f.buffer;
  if (f.staged) {
    c.pack = [buf = f.buffer, tensor] { copy_elements(buf, tensor); };
    c.unpack = [buf = f.buffer, tensor] { copy_elements(tensor, buf); };
  }
  c.bytes = static_cast<int64_t>(tensor.nbytes());
  return issue(std::move(c));
}

Work ProcessGroup::all_reduce_coalesced(std::vector<Tensor>& tensors, ReduceOp op) {
  if (tensors.empty()) return Work();
  std::vector<const Tensor*> ptrs;
  int64_t total = 0;
  for (const Tensor& t : tensors) {
    ptrs.push_back(&t);
    total += t.defined() ? t.numel() : 0;
  }
  Collective c = begin(CollectiveKind::kAllReduce, "all_reduce_coalesced", tensors[0].dtype(),
                       fmt::format("{} ({})", describe_all(tensors), reduce_op_name(op)), ptrs);
  check_reduce_op(c.call, op, c.dtype);
  Tensor buf = Tensor::empty({total}, c.dtype, tensors[0].device());
  c.op = op;
  c.input = c.output = buf;
  c.pack = [buf, tensors] {
    int64_t off = 0;
    for (const Tensor& t : tensors) {
      copy_elements(buf.narrow(0, off, t.numel()), t);
      off += t.numel();
    }
  };
  c.unpack = [buf, tensors] {
    int64_t off = 0;
    for (const Tensor& t : tensors) {
      copy_elements(t, buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
  };
  c.bytes = total * static_cast<int64_t>(itemsize(c.dtype));
  return issue(std::move(c));
}

// all_gather in elements: output holds counts[r] elements from each rank r.
static void plan_gather(Collective& c, int rank, Tensor& output, const Tensor& input, std::vector<int64_t> counts) {
  Flat out = flat_for(output);
  const int64_t offset = Collective::offset_of(counts, rank);
  if (!out.staged && sits_at(input, out.buffer, offset)) {
    c.input = out.buffer.narrow(0, offset, counts[rank]);  // in place
  } else if (!input.is_contiguous() || input.storage().is_same(output.storage())) {
    // Staged: strided, or overlapping the output somewhere other than this rank's block.
    Tensor staged = Tensor::empty({input.numel()}, input.dtype(), input.device());
    c.input = staged;
    c.pack = [staged, input] { copy_elements(staged, input); };
  } else {
    c.input = flat_view(input);
  }
  c.output = out.buffer;
  if (out.staged) c.unpack = [buf = out.buffer, output] { copy_elements(output, buf); };
  c.output_counts = std::move(counts);
  c.bytes = static_cast<int64_t>(output.nbytes());
}

Work ProcessGroup::all_gather_into_tensor(Tensor& output, const Tensor& input) {
  Collective c = begin(CollectiveKind::kAllGather, "all_gather_into_tensor", input.dtype(),
                       fmt::format("{} -> {} ({})", describe(input), describe(output), format_bytes(output.nbytes())),
                       {&output, &input});
  DTR_CHECK(output.numel() == input.numel() * size_, ValueError,
            "all_gather_into_tensor: output {} must hold group size {} x input {} = {} elements; it holds {}",
            describe(output), size_, describe(input), input.numel() * size_, output.numel());
  plan_gather(c, rank_, output, input, std::vector<int64_t>(size_, input.numel()));
  return issue(std::move(c));
}

Work ProcessGroup::all_gather_v(Tensor& output, const Tensor& input, std::vector<int64_t> counts) {
  Collective c = begin(
      CollectiveKind::kAllGather, "all_gather_v", input.dtype(),
      fmt::format("{} -> {} (rows {}, {})", describe(input), describe(output), counts, format_bytes(output.nbytes())),
      {&output, &input});
  check_counts(c.call, "counts", counts, size_, name());
  check_rows(c.call, output, input);
  DTR_CHECK(input.size(0) == counts[rank_] && output.size(0) == sum_of(counts), ValueError,
            "all_gather_v: rank {} must pass an input of counts[{}] = {} rows and an output of sum(counts) = {} "
            "rows; got input {} and output {}",
            rank_, rank_, counts[rank_], sum_of(counts), describe(input), describe(output));
  plan_gather(c, rank_, output, input, elements_of(counts, shape_numel(row_shape(input))));
  return issue(std::move(c));
}

Work ProcessGroup::all_gather_into_tensor_coalesced(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  DTR_CHECK(outputs.size() == inputs.size(), ValueError,
            "all_gather_into_tensor_coalesced: {} outputs for {} inputs; pass one output per input", outputs.size(),
            inputs.size());
  if (inputs.empty()) return Work();
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < inputs.size(); ++i) ptrs.insert(ptrs.end(), {&outputs[i], &inputs[i]});
  Collective c = begin(CollectiveKind::kAllGather, "all_gather_into_tensor_coalesced", inputs[0].dtype(),
                       fmt::format("{} -> {}", describe_all(inputs), describe_all(outputs)), ptrs);
  int64_t per_rank = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTR_CHECK(outputs[i].numel() == inputs[i].numel() * size_, ValueError,
              "all_gather_into_tensor_coalesced: outputs[{}] {} must hold group size {} x inputs[{}] {} = {} "
              "elements",
              i, describe(outputs[i]), size_, i, describe(inputs[i]), inputs[i].numel() * size_);
    per_rank += inputs[i].numel();
  }
  const Device device = inputs[0].device();
  Tensor in = Tensor::empty({per_rank}, c.dtype, device);
  Tensor out = Tensor::empty({per_rank * size_}, c.dtype, device);
  // Rank r's block of out is [inputs[0] | inputs[1] | ...] as rank r holds them.
  c.pack = [in, inputs] {
    int64_t off = 0;
    for (const Tensor& t : inputs) {
      copy_elements(in.narrow(0, off, t.numel()), t);
      off += t.numel();
    }
  };
  // Block by block, so every copy is contiguous (CUDA copies are).
  c.unpack = [out, outputs, per_rank, n = size_] {
    int64_t off = 0;
    for (const Tensor& t : outputs) {
      const int64_t k = t.numel() / n;
      Flat flat = flat_for(t);
      for (int r = 0; r < n; ++r) flat.buffer.narrow(0, r * k, k).copy_(out.narrow(0, r * per_rank + off, k));
      if (flat.staged) copy_elements(t, flat.buffer);
      off += k;
    }
  };
  c.input = in;
  c.output = out;
  c.output_counts.assign(size_, per_rank);
  c.bytes = out.numel() * static_cast<int64_t>(itemsize(c.dtype));
  return issue(std::move(c));
}

// reduce_scatter in elements: input holds counts[r] elements for each rank r.
static void plan_scatter(Collective& c, int rank, Tensor& output, const Tensor& input, std::vector<int64_t> counts) {
  Flat in = flat_for(input);
  if (in.staged) c.pack = [buf = in.buffer, input] { copy_elements(buf, input); };
  const int64_t offset = Collective::offset_of(counts, rank);
  if (!in.staged && sits_at(output, in.buffer, offset)) {
    c.output = in.buffer.narrow(0, offset, counts[rank]);  // in place
  } else if (!output.is_contiguous() || output.storage().is_same(input.storage())) {
    Tensor staged = Tensor::empty({output.numel()}, output.dtype(), output.device());
    c.output = staged;
    c.unpack = [staged, output] { copy_elements(output, staged); };
  } else {
    c.output = flat_view(output);
  }
  c.input = in.buffer;
  c.input_counts = std::move(counts);
  c.bytes = static_cast<int64_t>(input.nbytes());
}

Work ProcessGroup::reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op) {
  Collective c = begin(CollectiveKind::kReduceScatter, "reduce_scatter_tensor", input.dtype(),
                       fmt::format("{} -> {} ({}, {})", describe(input), describe(output), reduce_op_name(op),
                                   format_bytes(input.nbytes())),
                       {&output, &input});
  check_reduce_op(c.call, op, c.dtype);
  DTR_CHECK(input.numel() == output.numel() * size_, ValueError,
            "reduce_scatter_tensor: input {} must hold group size {} x output {} = {} elements; it holds {}",
            describe(input), size_, describe(output), output.numel() * size_, input.numel());
  c.op = op;
  plan_scatter(c, rank_, output, input, std::vector<int64_t>(size_, output.numel()));
  return issue(std::move(c));
}

Work ProcessGroup::reduce_scatter_v(Tensor& output, const Tensor& input, std::vector<int64_t> counts, ReduceOp op) {
  Collective c = begin(CollectiveKind::kReduceScatter, "reduce_scatter_v", input.dtype(),
                       fmt::format("{} -> {} (rows {}, {}, {})", describe(input), describe(output), counts,
                                   reduce_op_name(op), format_bytes(input.nbytes())),
                       {&output, &input});
  check_reduce_op(c.call, op, c.dtype);
  check_counts(c.call, "counts", counts, size_, name());
  check_rows(c.call, input, output);
  DTR_CHECK(output.size(0) == counts[rank_] && input.size(0) == sum_of(counts), ValueError,
            "reduce_scatter_v: rank {} must pass an input of sum(counts) = {} rows and an output of counts[{}] = {} "
            "rows; got input {} and output {}",
            rank_, sum_of(counts), rank_, counts[rank_], describe(input), describe(output));
  c.op = op;
  plan_scatter(c, rank_, output, input, elements_of(counts, shape_numel(row_shape(input))));
  return issue(std::move(c));
}

Work ProcessGroup::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                                   ReduceOp op) {
  DTR_CHECK(outputs.size() == inputs.size(), ValueError,
            "reduce_scatter_tensor_coalesced: {} outputs for {} inputs; pass one output per input", outputs.size(),
            inputs.size());
  if (inputs.empty()) return Work();
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < inputs.size(); ++i) ptrs.insert(ptrs.end(), {&outputs[i], &inputs[i]});
  Collective c =
      begin(CollectiveKind::kReduceScatter, "reduce_scatter_tensor_coalesced", inputs[0].dtype(),
            fmt::format("{} -> {} ({})", describe_all(inputs), describe_all(outputs), reduce_op_name(op)), ptrs);
  check_reduce_op(c.call, op, c.dtype);
  int64_t per_rank = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTR_CHECK(inputs[i].numel() == outputs[i].numel() * size_, ValueError,
              "reduce_scatter_tensor_coalesced: inputs[{}] {} must hold group size {} x outputs[{}] {} = {} elements",
              i, describe(inputs[i]), size_, i, describe(outputs[i]), outputs[i].numel() * size_);
    per_rank += outputs[i].numel();
  }
  const Device device = inputs[0].device();
  Tensor in = Tensor::empty({per_rank * size_}, c.dtype, device);
  Tensor out = Tensor::empty({per_rank}, c.dtype, device);
  // Rank r's block of in is [inputs[0]'s block r | inputs[1]'s block r | ...].
  c.pack = [in, inputs, per_rank, n = size_] {
    int64_t off = 0;
    for (const Tensor& t : inputs) {
      const int64_t k = t.numel() / n;
      const Tensor flat = t.is_contiguous() ? flat_view(t) : t.contiguous().view({t.numel()});
      for (int r = 0; r < n; ++r) in.narrow(0, r * per_rank + off, k).copy_(flat.narrow(0, r * k, k));
      off += k;
    }
  };
  c.unpack = [out, outputs] {
    int64_t off = 0;
    for (const Tensor& t : outputs) {
      copy_elements(t, out.narrow(0, off, t.numel()));
      off += t.numel();
    }
  };
  c.op = op;
  c.input = in;
  c.output = out;
  c.input_counts.assign(size_, per_rank);
  c.bytes = in.numel() * static_cast<int64_t>(itemsize(c.dtype));
  return issue(std::move(c));
}

Work ProcessGroup::all_to_all_single(Tensor& output, const Tensor& input, std::vector<int64_t> output_splits,
                                     std::vector<int64_t> input_splits) {
  Collective c = begin(CollectiveKind::kAllToAll, "all_to_all_single", input.dtype(),
                       fmt::format("{} -> {} (input splits {}, output splits {}, {})", describe(input),
                                   describe(output), input_splits, output_splits, format_bytes(input.nbytes())),
                       {&output, &input});
  check_rows(c.call, output, input);
  for (auto [splits, t, what] : {std::tuple{&input_splits, &input, "input"}, {&output_splits, &output, "output"}}) {
    if (splits->empty()) {
      DTR_CHECK(t->size(0) % size_ == 0, ValueError,
                "all_to_all_single: {} {} has {} rows, which do not split evenly over {} ranks; pass {}_splits", what,
                describe(*t), t->size(0), size_, what);
      splits->assign(size_, t->size(0) / size_);
    }
    check_counts(c.call, fmt::format("{}_splits", what), *splits, size_, name());
    DTR_CHECK(sum_of(*splits) == t->size(0), ValueError,
              "all_to_all_single: {}_splits {} add up to {} rows, but {} {} has {}", what, *splits, sum_of(*splits),
              what, describe(*t), t->size(0));
  }
  const int64_t row = shape_numel(row_shape(input));
  Flat out = flat_for(output);
  if (!input.is_contiguous() || input.storage().is_same(output.storage())) {
    Tensor staged = Tensor::empty({input.numel()}, input.dtype(), input.device());
    c.input = staged;
    c.pack = [staged, input] { copy_elements(staged, input); };
  } else {
    c.input = flat_view(input);
  }
  c.output = out.buffer;
  if (out.staged) c.unpack = [buf = out.buffer, output] { copy_elements(output, buf); };
  c.input_counts = elements_of(input_splits, row);
  c.output_counts = elements_of(output_splits, row);
  c.bytes = static_cast<int64_t>(input.nbytes());
  return issue(std::move(c));
}

Work ProcessGroup::broadcast(Tensor& tensor, int root) {
  Collective c =
      begin(CollectiveKind::kBroadcast, "broadcast", tensor.dtype(),
            fmt::format("{} from root {} ({})", describe(tensor), root, format_bytes(tensor.nbytes())), {&tensor});
  DTR_CHECK(root >= 0 && root < size_, IndexError,
            "broadcast: root {} is not a rank of group '{}' (group ranks are 0..{})", root, name(), size_ - 1);
  Flat f = flat_for(tensor);
  c.root = root;
  c.input = c.output = f.buffer;
  if (f.staged) {
    c.pack = [buf = f.buffer, tensor] { copy_elements(buf, tensor); };
    c.unpack = [buf = f.buffer, tensor] { copy_elements(tensor, buf); };
  }
  c.bytes = static_cast<int64_t>(tensor.nbytes());
  return issue(std::move(c));
}

Work ProcessGroup::barrier() {
  Collective c = begin(CollectiveKind::kBarrier, "barrier", kFloat32, "no tensors", {});
  return issue(std::move(c));
}

}  // namespace dtr
