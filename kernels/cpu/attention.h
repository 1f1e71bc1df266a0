// CPU kernels of fused attention and its backward (kernels/attention.h). Inputs are [*, T, E]
// of one floating dtype on the CPU with the same leading dims *, any strides, already
// checked (float32 rows with adjacent elements are read in place, others converted);
// outputs are contiguous [B, T, E] (B the leading dims' product) of the right dtypes, and
// are overwritten (lse [B, T], acc_dtype).
//
// Built on dtr's GEMM (cpu/gemm.h), in blocks of 64 query rows that each see keys [0, keys)
// (causal: up to the block's last row, so about half the products of a full [Tq, Tk] pass):
// forward, S = scale q_block k^T, each row's exact softmax over the keys it sees (exp_sum.h),
// out_block = P v and lse = max + log(sum). Backward, per batch entry with its blocks in
// order: S again (the same call, the same bits), P = exp(S - lse), dP = dO_block v^T,
// dS = P (dP - rowsum(dO out)), grad_v += P^T dO_block, grad_k += scale dS^T q_block,
// grad_q_block = scale dS k. A thread holds two [64, Tk] buffers; nothing [Tq, Tk] is kept.
// Math in float (double for float64, whose products are plain loops), rounded once on store.
// Each output element is computed by one thread in an order fixed by the sizes alone (the
// GEMM's K blocks, the query blocks in order): bitwise the same on any thread count.
#pragma once

#include "core/tensor.h"
#include "kernels/causal.h"

namespace dtr::cpu {

void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, Causal causal,
               double scale, int64_t query_offset);

void attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        Causal causal, double scale, int64_t query_offset);

}  // namespace dtr::cpu
