// Ragged paged attention (mixed prefill chunks and decode tokens) for NVIDIA GPUs: the kernel
// core. Plain CUDA templates and one entry point, launch_ragged_paged_attention(stream,
// params); no XLA types (the binding is ragged_paged_attention.cu).
//
// Semantics (the rules for inconsistent device data are SeqView's, ragged_paged_attention_ffi.h):
//   n     = clamp(num_seqs[0], 0, max_seqs)
//   c_j   = clamp(max(cu_q_lens[0..j]), 0, num_tokens), j <= n; sequence s owns rows [c_s, c_s+1)
//   L_s   = clamp(kv_lens[s], 0, max_blocks_per_seq * block_size)
//   row i of s (global row c_s + i) sits at p = L_s - q_len_s + i and attends
//           t in [max(0, p - window + 1), p]   (t in [0, p] without a window; none if p < 0)
//   token t of s is slot t % block_size of block block_tables[s, t / block_size]; it is masked
//           (never read) when that id is outside [0, num_blocks)
//   out   = softmax over the attended tokens of (scale * q.k, softcapped) times V; zeros for
//           rows that attend nothing and for rows no sequence owns (padding).
//
// Design (FlashAttention-2 style, one pass, no split over the context):
//  * Packed rows: for kv head kvh with G = num_q_heads / num_kv_heads q heads, a sequence has
//    q_len * G packed rows; packed row r is (query row r / G, q head kvh * G + r % G). GQA
//    groups and query rows thus share one M dimension, so a decode token with G >= 2 still
//    fills several MMA rows, and K/V are read once per kv head.
//  * Grid: x = an upper bound of the number of row tiles (MaxTiles in the limits header),
//    y = kv head. A CTA (4 warps) takes one tile of BM packed rows of one sequence. Which
//    (sequence, tile) is decided on the device: warp 0 scans cu_q_lens in chunks of 32 with
//    warp prefix sums (find_work); CTAs past the last tile exit.
//  * The CTA's token range [lo, hi) is the union of its rows' ranges; it is streamed in
//    32-token K/V tiles with 16-byte cp.async into shared memory (double-buffered; the f32
//    d=256 kernel single-buffers to fit sm_80's shared memory). Tokens outside [lo, hi) or
//    with an invalid block id are zero-filled with shared stores, never read from memory.
//  * bf16/f16: each warp owns 16 packed rows (one m16 slab). S = Q K^T and O += P V with
//    mma.sync m16n8k16 (f32 accumulate), operands via ldmatrix (.trans for V), P taken from
//    the S accumulators. f32: each warp owns 8 packed rows; lane j computes token j's logits
//    for the 8 rows with f32 FMAs, then O += P V with lanes over head_dim.
//  * Per-element mask (causal, window, valid token); online softmax in base 2 with f32
//    statistics; a warp skips tiles outside its own rows' range. Warps own disjoint rows, so
//    each normalizes and writes its own rows: no cross-warp merge.
//  * A small kernel writes zeros to the rows no sequence owns; every owned row is written by
//    exactly one CTA of the main kernel.
//  * Hopper: on a compute capability 9.0 device, with the library built for sm_90a (the op's
//    Kernel has arch_specific=True), bf16/f16 (head_dim 64, 128, 256) run the wgmma kernel
//    of ragged_paged_attention_sm90.cuh instead of the mma.sync kernel (128 packed rows per
//    CTA in two consumer warpgroups fed by a producer warpgroup; design there).
//    XLA_KERNELS_RAGGED_WGMMA=0 in the environment switches it off ("require": fail where it
//    cannot run; read at every launch).
//  * Decode-only batches (every q_len <= 1; known only on the device) take paged_attention's
//    flash-decoding kernels instead, which split long contexts over several CTAs (this
//    kernel does not). With a workspace (Params::workspace), a one-CTA kernel first decides
//    on the device whether the batch is decode-only and writes, per query row, the context
//    length its row attends (p + 1) and a copy of its block-table row; the decode kernels
//    then run over those rows (every row has length 0, i.e. writes zeros, when the batch is
//    not decode-only), and the kernels of this file exit at once when it is. Only for calls
//    with num_tokens <= max_seqs (has_decode_path). See decode_workspace_elems() for the
//    workspace's layout.
//  * fp8 caches (f8e4m3fn, bf16/f16 queries): on an sm_90a build and a compute capability
//    9.0 device, the wgmma kernel (its producer converts the e4m3 tiles: produce_kv_fp8);
//    otherwise (or with XLA_KERNELS_RAGGED_WGMMA=0) the mma.sync kernel (kFp8) streams the
//    e4m3 bytes with cp.async into raw double-buffered staging tiles (rows of D bytes), and
//    after the stage has landed all threads convert it (cvt e4m3x2 -> f16x2, bf16 through
//    f32; exact) into one padded bf16/f16 K/V tile pair, which the unchanged
//    ldmatrix/mma.sync path then reads: one more barrier and a shared-memory round trip per
//    tile, no new fragment layouts. k_scale is folded into the logit scale and v_scale into
//    the final 1/l, so the math is that of the bf16/f16 kernel on the dequantized cache. The
//    decode path passes the fp8 caches and scales to paged_attention's Fp8MmaCore.
//
// The parts, by role: ragged_params.h (the interface), ragged_common.cuh (arguments, work
// search, ranges, tile loads; xla_kernels/paged_cache.cuh walks the cache, shared with
// paged_attention), ragged_mma_kernel.cuh, ragged_simt_kernel.cuh, ragged_zero_kernel.cuh,
// ragged_paged_attention_sm90.cuh (the Hopper kernel and its sm90_*.cuh roles),
// ragged_decode_path.cuh, ragged_launch.cuh (host side); the tuning table is
// ragged_paged_attention_tuning.h.
#pragma once

#include "ragged_launch.cuh"
