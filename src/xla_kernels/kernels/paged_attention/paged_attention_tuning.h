// paged_attention's tuning decisions, one table: each value with the reason it was chosen
// (the measurements: docs/design/paged_attention.md). The kernels read these and nothing
// else; a new value is tried by editing it here and running benchmarks/gate.py.
#pragma once

namespace xla_kernels::paged_attention::tuning {

// Warps per CTA: 4 warps each stream their own tiles, then merge (m, l, O) once.
constexpr int kWarps = 4;

// L2 prefetch size of the K/V tile copies (cp.async .L2::128B): +2 % over none on the H100;
// 256 bytes is 4-9 % slower on the H200, 64 level with 128.
constexpr int kL2PrefetchBytes = 128;

// CTAs per SM the flash-decoding partitions aim for: more resident CTAs add partials and a
// reduce kernel without adding bandwidth (d 64 at 4 CTAs per SM measured slower).
constexpr int kPartitionCtasPerSm = 3;

// Tiles of block ids loaded ahead of the copies that use them: 2 hides a block-table load
// that waits behind the warp's own K/V copies under a saturated memory system (the top
// stall of the fp8 kernel at 1); bf16/f16/f32 caches at head_dim 64 keep 1, 1.5 % faster.
constexpr int block_ids_ahead(bool fp8_cache, int head_dim) {
  return !fp8_cache && head_dim == 64 ? 1 : 2;
}

// Threads' register bound at head_dim 64: 4 CTAs per SM (128 registers); block ids 2 tiles
// ahead raised the bf16/f16 kernel to 168 registers without it.
constexpr int min_ctas_per_sm(int head_dim) { return head_dim == 64 ? 4 : 1; }

// bf16/f16 caches (MmaCore): 16-token warp tiles, 32 at head_dim 64 so that a tile is 8 KB
// of K+V as at 128 (a 16-token d 64 tile pays the tile's fixed work per 4 KB: 1-2 % slower);
// 3 stages keep ~2 tiles per warp in flight while it computes.
constexpr int mma_tile_tokens(int head_dim) { return head_dim == 64 ? 32 : 16; }
constexpr int kMmaStages = 3;

// fp8 caches (Fp8MmaCore, Fp8MmaCoreT): 32-token tiles (the bytes of a 16-token bf16 tile);
// 16 at head_dim 256, where 32 leaves room for one CTA per SM and 16 for two (7-11 % faster);
// 2 stages: 0.5-4 % faster than 3 at 5 of 6 configurations on the H200 (level at the
// sixth) with block ids 2 tiles ahead; 2 CTAs per SM at head_dim 128 either way.
constexpr int fp8_tile_tokens(int head_dim) { return head_dim == 256 ? 16 : 32; }
constexpr int kFp8Stages = 2;

// fp8 caches at up to this many q heads per kv head put tokens on the MMA rows
// (Fp8MmaCoreT: half the MMAs of Fp8MmaCore, whose rows are q heads).
constexpr int kFp8TokensOnRowsMaxHeads = 8;
// Fp8MmaCoreT's CTAs per SM at head_dim 128 and 256: 3 would fit, 2 measured faster.
constexpr int fp8_tokens_on_rows_max_ctas(int head_dim) { return head_dim == 64 ? 0 : 2; }

// f32 (SimtCore, the exact path): tiles of about 4 KB per K or V (4 to 32 tokens), as many
// stages as the bf16/f16 kernel.
constexpr int simt_tile_tokens(int row_bytes) {
  return 4096 / row_bytes > 32 ? 32 : (4096 / row_bytes < 4 ? 4 : 4096 / row_bytes);
}
constexpr int kSimtStages = 3;

}  // namespace xla_kernels::paged_attention::tuning
