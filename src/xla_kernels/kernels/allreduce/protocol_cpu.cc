// The all-reduce protocol of protocol.h run by the CPU: each process is a rank, each thread a
// CUDA block, the workspaces are shared memory mapped by every rank. It does what the CUDA
// kernel will do, in the same order and with the same memory orders, so that the layout, the
// partition and the barrier can be tested without GPUs (tests/test_allreduce_protocol.py).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "protocol.h"

namespace xk::allreduce {
namespace {

static_assert(std::atomic_ref<uint32_t>::is_always_lock_free,
              "flags shared between processes need lock-free (address-free) atomics");

struct CpuFlags {
  static void store_release(uint32_t* flag, uint32_t value) {
    std::atomic_ref<uint32_t>(*flag).store(value, std::memory_order_release);
  }
  static uint32_t load_acquire(const uint32_t* flag) {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(flag)).load(std::memory_order_acquire);
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  // Ranks outnumber cores in the tests: a poll that spins without yielding would starve the
  // peer it waits for.
  static void pause() { std::this_thread::yield(); }
};

// Element types: float (f32) and uint16_t holding bf16 bits. Sums are in f32.
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) {
  uint32_t bits = uint32_t(bf16) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
template <class T> T from_f32(float v);
template <> float from_f32<float>(float v) { return v; }
template <> uint16_t from_f32<uint16_t>(float v) {  // round to nearest even, NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

struct Call {
  uint8_t* const* bases;  // every rank's workspace as this process maps it
  int ranks, rank, blocks, mode, fused;
  int64_t n, width, capacity, timeout_ns;
  const void* x;
  const void* residual;
  const void* weight;
  float eps;
  void* out;
  void* residual_out;
};

struct Failure {
  uint32_t missing = 0, epoch = 0;
};

template <class T>
void finish(const Call& c, int64_t u, const float* sum) {
  int64_t begin = u * c.width, end = std::min(c.n, begin + c.width);
  T* out = static_cast<T*>(c.out);
  if (!c.fused) {
    for (int64_t i = begin; i < end; ++i) out[i] = from_f32<T>(sum[i - begin]);
    return;
  }
  // residual_out = round(round(sum) + residual); out = rms_norm(residual_out) * weight, as
  // fused_add_rms_norm(psum(x), residual, weight) computes it.
  const T* res = static_cast<const T*>(c.residual);
  const T* w = static_cast<const T*>(c.weight);
  T* res_out = static_cast<T*>(c.residual_out);
  float squares = 0.f;
  for (int64_t i = begin; i < end; ++i) {
    T r = from_f32<T>(to_f32(from_f32<T>(sum[i - begin])) + to_f32(res[i]));
    res_out[i] = r;
    squares += to_f32(r) * to_f32(r);
  }
  float inv = 1.f / std::sqrt(squares / float(end - begin) + c.eps);
  for (int64_t i = begin; i < end; ++i)
    out[i] = from_f32<T>(to_f32(res_out[i]) * inv * to_f32(w[i - begin]));
}

// Unit u of the sum over ranks 0..ranks-1 in that order (every rank, and both modes, add in
// the same order: the results are bitwise equal everywhere), from the regions `src`, whose
// element 0 is element `first` of the message.
template <class T>
void reduce_unit(const Call& c, T* const* src, int64_t first, int64_t u, float* sum) {
  int64_t begin = u * c.width, end = std::min(c.n, begin + c.width);
  for (int64_t i = begin; i < end; ++i) {
    float acc = to_f32(src[0][i - first]);
    for (int p = 1; p < c.ranks; ++p) acc += to_f32(src[p][i - first]);
    sum[i - begin] = acc;
  }
}

template <class T>
void copy_unit(const Call& c, T* dst, int64_t first, int64_t u) {
  int64_t begin = u * c.width, end = std::min(c.n, begin + c.width);
  std::memcpy(dst + (begin - first), static_cast<const T*>(c.x) + begin,
              size_t(end - begin) * sizeof(T));
}

template <class T>
void run_block(const Call& c, int b, Failure* failure) {
  Layout lay = layout(size_t(c.capacity));
  Signal* peers[kMaxRanks] = {};
  T* input[kMaxRanks] = {};
  T* scratch[kMaxRanks] = {};
  for (int p = 0; p < c.ranks; ++p) peers[p] = reinterpret_cast<Signal*>(c.bases[p]);
  Signal* self = reinterpret_cast<Signal*>(c.bases[c.rank]);
  uint32_t parity = self->calls & 1;
  for (int p = 0; p < c.ranks; ++p) {
    input[p] = reinterpret_cast<T*>(c.bases[p] + lay.input(parity));
    scratch[p] = reinterpret_cast<T*>(c.bases[p] + lay.scratch());
  }
  int64_t units = unit_count(c.n, c.width);
  std::vector<float> sum(size_t(c.width));
  auto meet = [&] {
    return barrier<CpuFlags>(self, peers, c.rank, c.ranks, b, c.timeout_ns, &failure->missing,
                             &failure->epoch);
  };
  if (c.mode == kOneShot) {
    Range all{0, units};
    for_block_units(all, b, c.blocks, [&](int64_t u) { copy_unit(c, input[c.rank], 0, u); });
    if (!meet()) return;
    for_block_units(all, b, c.blocks, [&](int64_t u) {
      reduce_unit(c, input, 0, u, sum.data());
      finish<T>(c, u, sum.data());
    });
  } else {
    // Copy in share by share, so that block b writes exactly the units block b of the
    // share's owner will read.
    for (int s = 0; s < c.ranks; ++s)
      for_block_units(share(units, c.ranks, s), b, c.blocks,
                      [&](int64_t u) { copy_unit(c, input[c.rank], 0, u); });
    if (!meet()) return;
    Range mine = share(units, c.ranks, c.rank);
    int64_t first = mine.begin * c.width;
    for_block_units(mine, b, c.blocks, [&](int64_t u) {
      reduce_unit(c, input, 0, u, sum.data());
      int64_t begin = u * c.width, end = std::min(c.n, begin + c.width);
      for (int64_t i = begin; i < end; ++i) scratch[c.rank][i - first] = from_f32<T>(sum[i - begin]);
    });
    if (!meet()) return;
    for (int s = 0; s < c.ranks; ++s) {
      Range theirs = share(units, c.ranks, s);
      int64_t at = theirs.begin * c.width;
      for_block_units(theirs, b, c.blocks, [&](int64_t u) {
        int64_t begin = u * c.width, end = std::min(c.n, begin + c.width);
        for (int64_t i = begin; i < end; ++i) sum[i - begin] = to_f32(scratch[s][i - at]);
        finish<T>(c, u, sum.data());
      });
    }
  }
  if (std::atomic_ref<uint32_t>(self->done).fetch_add(1, std::memory_order_acq_rel) ==
      uint32_t(c.blocks - 1)) {
    self->done = 0;
    ++self->calls;
  }
}

template <class T>
int run(const Call& c, uint32_t* missing, uint32_t* epoch, int32_t* block) {
  std::vector<Failure> failures(size_t(c.blocks));
  std::vector<std::thread> threads;
  for (int b = 0; b < c.blocks; ++b) threads.emplace_back(run_block<T>, std::cref(c), b, &failures[b]);
  for (auto& t : threads) t.join();
  for (int b = 0; b < c.blocks; ++b) {
    if (failures[b].missing) {
      *missing = failures[b].missing;
      *epoch = failures[b].epoch;
      *block = b;
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace xk::allreduce

extern "C" {

// The workspace's size in bytes for a capacity (bytes per region).
int64_t XkAllReduceWorkspaceBytes(int64_t capacity) {
  return int64_t(xk::allreduce::layout(size_t(capacity)).total());
}

int32_t XkAllReduceLimits(int32_t which) {
  return which == 0 ? xk::allreduce::kMaxRanks : xk::allreduce::kMaxBlocks;
}

// One all-reduce (fused = 0) or all-reduce + residual add + RMSNorm (fused = 1, width =
// hidden) of n elements, dtype 0 = f32, 1 = bf16. Returns 0, or 1 when peers did not arrive
// within timeout_ns: their ranks as bits of *missing, the barrier's epoch and block. Runs
// grid(...) threads, one per CUDA block.
int32_t XkAllReduceRun(uint8_t* const* bases, int32_t ranks, int32_t rank, int32_t max_blocks,
                       int32_t mode, int32_t dtype, int32_t fused, int64_t n, int64_t width,
                       int64_t capacity, int64_t timeout_ns, const void* x, const void* residual,
                       const void* weight, float eps, void* out, void* residual_out,
                       uint32_t* missing, uint32_t* epoch, int32_t* block) {
  int blocks = xk::allreduce::grid(xk::allreduce::unit_count(n, width), ranks, mode, max_blocks);
  xk::allreduce::Call c{bases, ranks, rank, blocks, mode, fused, n, width, capacity, timeout_ns,
                        x, residual, weight, eps, out, residual_out};
  return dtype == 0 ? xk::allreduce::run<float>(c, missing, epoch, block)
                    : xk::allreduce::run<uint16_t>(c, missing, epoch, block);
}

}  // extern "C"
