// Decode paged attention (one query token per sequence) for NVIDIA GPUs: the kernel core.
//
// Plain CUDA templates and one entry point, launch_paged_attention(stream, params); no XLA
// types (the binding is paged_attention.cu). Semantics, for sequence s and query head h
// (kv head kvh = h / (num_q_heads / num_kv_heads)):
//
//   L      = min(seq_lens[s], max_blocks_per_seq * block_size)     (capacity clamp)
//   tokens = { t : max(0, L - sliding_window) <= t < L }            (all of [0, L) if window 0)
//   phys   = block_tables[s, t / block_size];  token t is skipped (masked) when phys is not
//            in [0, num_blocks): no address is formed from an out-of-range id
//   x_t    = scale * (q[s, h] . K[phys, t % block_size, kvh]);  softcap > 0: softcap*tanh(x/softcap)
//   out    = sum_t softmax(x)_t V[phys, t % block_size, kvh]     (all zeros when no token is left)
//
// Design (flash-decoding):
//  * Main kernel: one CTA of 4 warps per (sequence, partition, kv head, head chunk). A CTA
//    serves every query head of its kv head (up to 16 with tensor cores, 8 on the f32 path),
//    so K/V are read from memory once per kv head (GQA/MQA).
//  * Partitions: the active token range of a sequence (known only on the device) is cut into
//    n <= T partitions of P tokens (P a multiple of the CTA tile, at least kPartMin tokens);
//    T is picked on the host so that the grid fills the GPU once (slots = SMs x CTAs per SM,
//    at most kPartitionCtasPerSm = 3 of them).
//    CTAs past a sequence's n exit at once. With n == 1 the CTA writes the output directly;
//    otherwise it writes (acc, m, l) partials to the workspace and a small reduce kernel
//    (one CTA per (sequence, q head), its loads batched) combines them. The reduce kernel
//    is not launched at all when T == 1.
//  * Programmatic dependent launch (sm_90+, cuda_pdl.cuh): both kernels are launched with
//    PDL and wait (griddepcontrol.wait) before touching global memory, so the reduce kernel
//    is already resident when the main kernel's last CTAs finish, and a call overlaps the
//    previous kernel's tail; results are those of plain stream order.
//  * Loads: each warp streams its own tiles (NW tokens of K and V) into shared memory with
//    16-byte cp.async, kStages deep, so ~2 tiles per warp are in flight while it computes.
//    Staged rows are unpadded, their 16-byte chunks XOR-swizzled (swz_chunk), so each row
//    starts on a 128-byte line of shared memory: a cp.async whose destination straddles
//    lines is split, and L2 then served 1.5x the sectors (the design notes).
//    Rows of masked tokens (beyond L, outside the window, invalid block id) are zero-filled
//    with plain shared stores and never read from global memory.
//  * Math: bf16/f16 use mma.sync m16n8k16 (f32 accumulate): S = Q K^T with the q heads as the
//    M dimension (padded to 16), then O += P V with P taken straight from the S accumulators
//    (FlashAttention-2 register layout). f32 uses CUDA cores (exact f32 FMAs).
//  * Online softmax in base 2 with f32 statistics; the 4 warps of a CTA each keep their own
//    (m, l, O) and are merged through shared memory at the end.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries; Fp8MmaCore): the same pipeline with 32-token
//    tiles (the bytes of a 16-token bf16 tile, so as many bytes stay in flight), staged as
//    e4m3 in shared memory with an XOR swizzle of the 16-byte chunks instead of padding.
//    Lanes read their K and V bytes straight into registers (K: 16-byte loads, the head
//    dimension permuted so one lane's 4 values per k-step are adjacent, Q permuted alike;
//    V: 4-byte loads of 4 dims of 4 tokens, byte-permuted into (token, token+1) pairs) and
//    convert them with cvt e4m3x2 -> f16x2 (bf16 through f32; every e4m3 value is exact in
//    both) for the same m16n8k16 MMAs. k_scale is folded into the logit scale and v_scale
//    into the final normalization, so the math is that of the bf16/f16 kernel on the
//    dequantized cache. At up to 8 q heads per kv head (Fp8MmaCoreT) the MMA operands are
//    swapped (S^T = K Q^T, O^T = V^T P^T): tokens and head dims fill the 16 MMA rows and the
//    8 q heads the columns, so half as many MMAs run; at most 2 of its CTAs share an SM
//    (cap_ctas_per_sm), the occupancy of Fp8MmaCore, which measured faster than 3.
//
// The parts, by role: decode_params.h (the interface), decode_common.cuh (arguments,
// partitions, conversions), xla_kernels/paged_cache.cuh (the cache walk, shared with
// ragged_paged_attention), decode_tile_loader.cuh (K/V tiles into shared memory),
// decode_softmax.cuh, decode_mma_core.cuh / decode_fp8_core.cuh / decode_simt_core.cuh (the
// math per dtype), decode_main_kernel.cuh, decode_reduce_kernel.cuh (partitions combined),
// decode_launch.cuh (host side); the tuning table is paged_attention_tuning.h.
#pragma once

#include "decode_launch.cuh"
