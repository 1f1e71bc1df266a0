// Shape ops that join and cut tensors along one dim: cat, split, chunk (torch's names).
//
// cat copies into a new contiguous tensor, whole contiguous blocks by memcpy (collectives
// pack and unpack their buffers with it); split and chunk return views (narrow). Chunks
// have torch.chunk's size ceil(n / k), but chunk_padded returns exactly k, since DTensor's
// Shard(d) needs one per rank:
//   n, k    chunk_sizes      chunk           chunk_padded
//   5, 2    3 2              3 2             3 2
//   6, 4    2 2 2 0          2 2 2           2 2 2 0
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace dtr {

// Concatenates tensors along dim into a new contiguous tensor. All share dtype, device
// and rank; sizes match except along dim (where 0 is allowed).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// cat into out, a contiguous tensor of the concatenated shape, dtype and device.
Tensor& cat_out(Tensor& out, const std::vector<Tensor>& tensors, int64_t dim = 0);

// Views of split_size rows each along dim; the last may be smaller. A size-0 dim gives
// one empty view (split_size may then be 0).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Views with the given sizes along dim (torch.split_with_sizes); they must sum to x.size(dim).
std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> split_sizes, int64_t dim = 0);
inline std::vector<Tensor> split(const Tensor& x, std::initializer_list<int64_t> split_sizes, int64_t dim = 0) {
  return split(x, std::span(split_sizes.begin(), split_sizes.size()), dim);
}

// Exactly `chunks` sizes that split n like torch.chunk: ceil(n / chunks) each until n
// runs out, then the remainder, then zeros. The sizes of Shard(d) on `chunks` ranks.
std::vector<int64_t> chunk_sizes(int64_t n, int64_t chunks);
// torch.chunk: views of ceil(n / chunks) rows; fewer than `chunks` views when the rows
// run out (the empty tail is dropped), except that a size-0 dim gives `chunks` empty views.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// Exactly `chunks` views, sized by chunk_sizes: torch.chunk's views followed by empty ones
// (PyTorch DTensor's chunk + fill_empty_tensor_to_shards). View r is rank r's Shard(dim).
std::vector<Tensor> chunk_padded(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace dtr
