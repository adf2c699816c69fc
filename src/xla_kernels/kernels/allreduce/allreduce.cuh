// The all-reduce of protocol.h on NVIDIA GPUs: one kernel per rank and call, its blocks doing
// what run_block in protocol_cpu.cc does, in the same order, with the CUDA flag operations of
// docs/design/allreduce.md ("Memory ordering"): after a __syncthreads, thread 0 stores the
// block's epoch to every rank's flags with st.release.sys and polls its own with
// ld.acquire.sys (__nanosleep between polls, %globaltimer for the deadline), then a second
// __syncthreads hands the peers' writes to the block's threads. Peers' regions are read with
// ld.global.cg (L2, not a possibly stale L1 line). A barrier whose peers do not arrive in time
// writes its record (rank, missing ranks, epoch, block) to the host-mapped Status and traps:
// the step fails with a CUDA error instead of hanging.
//
// Units: a plain all-reduce takes kThreads 16-byte packs per unit (one per thread); the fused
// all-reduce + residual add + RMSNorm a row of `hidden` per unit, its threads striding the
// row by packs. Sums are f32 in rank order on every rank and in both modes, so every rank's
// outputs are bitwise equal, and a plain all-reduce equals the CPU simulation's bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "protocol.h"
#include "xla_kernels/cuda_f32.cuh"

namespace xk::allreduce {

inline constexpr int kThreads = 512;

struct CudaFlags {
  __device__ static void store_release(uint32_t* flag, uint32_t value) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
  }
  __device__ static uint32_t load_acquire(const uint32_t* flag) {
    uint32_t value;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
    return value;
  }
  __device__ static int64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return static_cast<int64_t>(t);
  }
  __device__ static void pause() { __nanosleep(100); }
};

// Where a rank's kernel reports a barrier that timed out (host-mapped: readable after the
// trap). failed is written last.
struct Status {
  uint32_t rank, missing, epoch, block;
  uint32_t failed;
};

// One rank's call, passed by value. bases: every rank's workspace as this device addresses
// it (peers through CUDA IPC or peer access).
struct Call {
  uint8_t* bases[kMaxRanks];
  int32_t ranks, rank, mode, fused;
  int64_t n, width, capacity, timeout_ns;
  const void* x;
  const void* residual;
  const void* weight;
  float eps;
  void* out;
  void* residual_out;
  Status* status;
};

using xla_kernels::FromF32;
using xla_kernels::ToF32;

// 16 bytes of T.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ inline Pack<T> LoadL2(const T* p) {
  const int4 raw = __ldcg(reinterpret_cast<const int4*>(p));
  Pack<T> pack;
  *reinterpret_cast<int4*>(&pack) = raw;
  return pack;
}

__device__ inline float BlockSum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // `shared` may still be read from the previous row
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += shared[w];
  return total;
}

template <typename T>
struct Block {
  const Call& c;
  Signal* self;
  Signal* peers[kMaxRanks];
  const T* input[kMaxRanks];
  const T* scratch[kMaxRanks];
  T* my_input;
  T* my_scratch;
  bool vectors;  // 16-byte packs: widths in whole packs, every pointer 16-byte aligned
  float* shared;

  // Block b's meeting with block b of every rank; traps with the record on a timeout.
  __device__ void Meet() {
    __syncthreads();  // every thread's writes precede thread 0's release
    if (threadIdx.x == 0) {
      uint32_t missing = 0, epoch = 0;
      if (!barrier<CudaFlags>(self, peers, c.rank, c.ranks, blockIdx.x, c.timeout_ns,
                              &missing, &epoch)) {
        c.status->rank = c.rank;
        c.status->missing = missing;
        c.status->epoch = epoch;
        c.status->block = blockIdx.x;
        __threadfence_system();
        c.status->failed = 1;
        __threadfence_system();
        __trap();
      }
    }
    __syncthreads();  // thread 0's acquire precedes every thread's reads of the peers
  }

  // fn(i, count) over this thread's elements of [begin, end): count = Pack::kN for a whole
  // pack at i (vector path), else 1 (element i alone).
  template <typename F>
  __device__ void ForElements(int64_t begin, int64_t end, F&& fn) const {
    constexpr int kN = Pack<T>::kN;
    if (vectors) {
      for (int64_t i = begin + int64_t{threadIdx.x} * kN; i < end; i += int64_t{kThreads} * kN)
        if (i + kN <= end) {
          fn(i, kN);
        } else {
          for (int64_t j = i; j < end; ++j) fn(j, 1);
        }
    } else {
      for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) fn(i, 1);
    }
  }

  // Unit u of x into this rank's input region, whose element 0 is element `first`.
  __device__ void CopyIn(int64_t u, int64_t first) const {
    const int64_t begin = u * c.width, end = begin + c.width < c.n ? begin + c.width : c.n;
    const T* x = static_cast<const T*>(c.x);
    ForElements(begin, end, [&](int64_t i, int count) {
      if (count > 1) {
        *reinterpret_cast<int4*>(my_input + (i - first)) = *reinterpret_cast<const int4*>(x + i);
      } else {
        my_input[i - first] = x[i];
      }
    });
  }

  // The f32 sum over the ranks, in rank order, of `count` elements at i from `regions`
  // (element 0 of each is element `first` of the message).
  __device__ void Sum(const T* const* regions, int64_t first, int64_t i, int count,
                      float* sum) const {
    if (count > 1) {
      Pack<T> p = LoadL2(regions[0] + (i - first));
#pragma unroll
      for (int k = 0; k < Pack<T>::kN; ++k) sum[k] = ToF32(p.v[k]);
      for (int r = 1; r < c.ranks; ++r) {
        p = LoadL2(regions[r] + (i - first));
#pragma unroll
        for (int k = 0; k < Pack<T>::kN; ++k) sum[k] += ToF32(p.v[k]);
      }
    } else {
      float acc = ToF32(T(__ldcg(reinterpret_cast<const T*>(regions[0] + (i - first)))));
      for (int r = 1; r < c.ranks; ++r)
        acc += ToF32(T(__ldcg(reinterpret_cast<const T*>(regions[r] + (i - first)))));
      sum[0] = acc;
    }
  }

  // The plain all-reduce's output of `count` elements at i.
  __device__ void WriteOut(int64_t i, int count, const float* sum) const {
    T* out = static_cast<T*>(c.out);
    if (count > 1) {
      Pack<T> p;
#pragma unroll
      for (int k = 0; k < Pack<T>::kN; ++k) p.v[k] = FromF32<T>(sum[k]);
      *reinterpret_cast<Pack<T>*>(out + i) = p;
    } else {
      out[i] = FromF32<T>(sum[0]);
    }
  }

  // Fused epilogue of row u, whose sums come from `sum_of(i, count, sum)`:
  // residual_out = round(round(sum) + residual); out = rms_norm(residual_out) * weight.
  template <typename SumOf>
  __device__ void FinishRow(int64_t u, SumOf&& sum_of) const {
    const int64_t begin = u * c.width, end = begin + c.width < c.n ? begin + c.width : c.n;
    const T* res = static_cast<const T*>(c.residual);
    const T* w = static_cast<const T*>(c.weight);
    T* res_out = static_cast<T*>(c.residual_out);
    T* out = static_cast<T*>(c.out);
    float squares = 0.f;
    ForElements(begin, end, [&](int64_t i, int count) {
      float sum[Pack<T>::kN];
      sum_of(i, count, sum);
      for (int k = 0; k < count; ++k) {
        const T r = FromF32<T>(ToF32(FromF32<T>(sum[k])) + ToF32(res[i + k]));
        res_out[i + k] = r;
        squares += ToF32(r) * ToF32(r);
      }
    });
    const float inv =
        rsqrtf(BlockSum(squares, shared) / static_cast<float>(end - begin) + c.eps);
    // Each thread reads back only the elements of residual_out it wrote itself.
    ForElements(begin, end, [&](int64_t i, int count) {
      for (int k = 0; k < count; ++k)
        out[i + k] = FromF32<T>(ToF32(res_out[i + k]) * inv * ToF32(w[i - begin + k]));
    });
  }

  __device__ void Finish(int64_t u, const T* const* regions, int64_t first) const {
    if (c.fused) {
      FinishRow(u, [&](int64_t i, int count, float* sum) { Sum(regions, first, i, count, sum); });
      return;
    }
    const int64_t begin = u * c.width, end = begin + c.width < c.n ? begin + c.width : c.n;
    ForElements(begin, end, [&](int64_t i, int count) {
      float sum[Pack<T>::kN];
      Sum(regions, first, i, count, sum);
      WriteOut(i, count, sum);
    });
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) AllReduceKernel(Call c) {
  __shared__ float shared[kThreads / 32];
  __shared__ uint32_t parity;
  const Layout lay = layout(static_cast<size_t>(c.capacity));
  Block<T> blk{c, reinterpret_cast<Signal*>(c.bases[c.rank])};
  if (threadIdx.x == 0) parity = *reinterpret_cast<volatile uint32_t*>(&blk.self->calls) & 1;
  __syncthreads();
  for (int p = 0; p < c.ranks; ++p) {
    blk.peers[p] = reinterpret_cast<Signal*>(c.bases[p]);
    blk.input[p] = reinterpret_cast<const T*>(c.bases[p] + lay.input(parity));
    blk.scratch[p] = reinterpret_cast<const T*>(c.bases[p] + lay.scratch());
  }
  blk.my_input = reinterpret_cast<T*>(c.bases[c.rank] + lay.input(parity));
  blk.my_scratch = reinterpret_cast<T*>(c.bases[c.rank] + lay.scratch());
  blk.shared = shared;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  blk.vectors = c.width % Pack<T>::kN == 0 && aligned(c.x) && aligned(c.out) &&
                (!c.fused || (aligned(c.residual) && aligned(c.weight) &&
                              aligned(c.residual_out)));

  const int64_t units = unit_count(c.n, c.width);
  const int b = blockIdx.x, blocks = gridDim.x;
  if (c.mode == kOneShot) {
    const Range all{0, units};
    for_block_units(all, b, blocks, [&](int64_t u) { blk.CopyIn(u, 0); });
    blk.Meet();
    for_block_units(all, b, blocks, [&](int64_t u) { blk.Finish(u, blk.input, 0); });
  } else {
    // Copy in share by share: block b writes exactly the units block b of each share's owner
    // reads.
    for (int s = 0; s < c.ranks; ++s)
      for_block_units(share(units, c.ranks, s), b, blocks,
                      [&](int64_t u) { blk.CopyIn(u, 0); });
    blk.Meet();
    const Range mine = share(units, c.ranks, c.rank);
    const int64_t first = mine.begin * c.width;
    for_block_units(mine, b, blocks, [&](int64_t u) {
      const int64_t begin = u * c.width, end = begin + c.width < c.n ? begin + c.width : c.n;
      blk.ForElements(begin, end, [&](int64_t i, int count) {
        float sum[Pack<T>::kN];
        blk.Sum(blk.input, 0, i, count, sum);
        for (int k = 0; k < count; ++k) blk.my_scratch[i + k - first] = FromF32<T>(sum[k]);
      });
    });
    blk.Meet();
    for (int s = 0; s < c.ranks; ++s) {
      const Range theirs = share(units, c.ranks, s);
      const int64_t at = theirs.begin * c.width;
      const T* owner = blk.scratch[s];
      // The owner's reduced share, already rounded to T: the sums of its units.
      for_block_units(theirs, b, blocks, [&](int64_t u) {
        if (c.fused) {
          blk.FinishRow(u, [&](int64_t i, int count, float* sum) {
            if (count > 1) {
              const Pack<T> p = LoadL2(owner + (i - at));
#pragma unroll
              for (int k = 0; k < Pack<T>::kN; ++k) sum[k] = ToF32(p.v[k]);
            } else {
              sum[0] = ToF32(T(__ldcg(owner + (i - at))));
            }
          });
        } else {
          const int64_t begin = u * c.width, end = begin + c.width < c.n ? begin + c.width : c.n;
          blk.ForElements(begin, end, [&](int64_t i, int count) {
            if (count > 1) {
              *reinterpret_cast<int4*>(static_cast<T*>(c.out) + i) =
                  __ldcg(reinterpret_cast<const int4*>(owner + (i - at)));
            } else {
              static_cast<T*>(c.out)[i] = __ldcg(owner + (i - at));
            }
          });
        }
      });
    }
  }
  // The call's last block advances `calls` (the next call's input region).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&blk.self->done, 1u) == static_cast<uint32_t>(blocks - 1)) {
      blk.self->done = 0;
      blk.self->calls += 1;
      __threadfence();
    }
  }
}

}  // namespace xk::allreduce
