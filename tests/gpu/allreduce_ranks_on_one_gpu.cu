// The all-reduce kernel (src/xla_kernels/kernels/allreduce/allreduce.cuh) with R ranks on ONE
// GPU: each rank has its own workspace in device memory and its own stream, and every call
// launches the R rank kernels at once, each with at most SMs / R blocks so that all blocks of
// all ranks are resident together (a block spins on its peers' block). This runs the
// protocol's barrier, epochs, parity regions, one-shot and two-shot, and the fused epilogue
// on a GPU before two GPUs are at hand; what it cannot run is NVLink and CUDA IPC.
//
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a \
//     -I src/xla_kernels/kernels/allreduce tests/gpu/allreduce_ranks_on_one_gpu.cu -o ar
//   ./ar check          # every case; exit 1 on the first mismatch
//   ./ar hang           # rank 1 skips a call: rank 0 must trap with its record naming rank 1
//   ./ar time           # µs per call (one-shot, 2 ranks) from 8 KiB to 8 MiB
//
// Checks, per case and call: a plain all-reduce equals the host's f32 sum in rank order bit for
// bit on every rank; the fused one's residual_out equals the host's round(round(sum) +
// residual) bit for bit and out is bitwise equal on every rank and in both modes, and within
// 2^-6 (bf16) / 1e-5 (f32) of a float64 reference. Many calls run on one workspace (epochs,
// parities), with sizes and modes changing between calls.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "allreduce.cuh"
#include "xla_kernels/half.h"

namespace ar = xk::allreduce;

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

constexpr int64_t kCapacity = 8 << 20;

struct Group {
  int ranks, sms, max_blocks;
  std::vector<uint8_t*> bases;
  std::vector<cudaStream_t> streams;
  ar::Status* status = nullptr;  // host-mapped
};

Group MakeGroup(int ranks) {
  Group g{ranks};
  CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, 0));
  g.max_blocks = std::min(ar::kMaxBlocks, g.sms / ranks);
  const size_t bytes = ar::layout(kCapacity).total();
  for (int r = 0; r < ranks; ++r) {
    uint8_t* base = nullptr;
    CHECK(cudaMalloc(&base, bytes));
    CHECK(cudaMemset(base, 0, bytes));
    g.bases.push_back(base);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    g.streams.push_back(s);
  }
  CHECK(cudaDeviceSynchronize());  // every workspace zeroed before any flag is written
  CHECK(cudaHostAlloc(&g.status, sizeof(ar::Status), cudaHostAllocMapped));
  std::memset(g.status, 0, sizeof(ar::Status));
  return g;
}

struct Buffers {  // one rank's operands and results, device
  void* x;
  void* residual;
  void* weight;
  void* out;
  void* residual_out;
};

// Launches every rank's kernel of one call (rank `skip` not launched) and waits for all.
template <typename T>
void Launch(const Group& g, const std::vector<Buffers>& buf, int mode, bool fused, int64_t n,
            int64_t width, int skip = -1, int64_t timeout_ns = 5'000'000'000) {
  const int64_t units = ar::unit_count(n, width);
  const int blocks = ar::grid(units, g.ranks, mode, g.max_blocks);
  ar::Status* status = nullptr;
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&status), g.status, 0));
  for (int r = 0; r < g.ranks; ++r) {
    if (r == skip) continue;
    ar::Call c{};
    for (int p = 0; p < g.ranks; ++p) c.bases[p] = g.bases[p];
    c.ranks = g.ranks;
    c.rank = r;
    c.mode = mode;
    c.fused = fused;
    c.n = n;
    c.width = width;
    c.capacity = kCapacity;
    c.timeout_ns = timeout_ns;
    c.x = buf[r].x;
    c.residual = buf[r].residual;
    c.weight = buf[r].weight;
    c.eps = 1e-6f;
    c.out = buf[r].out;
    c.residual_out = buf[r].residual_out;
    c.status = status;
    ar::AllReduceKernel<T><<<blocks, ar::kThreads, 0, g.streams[r]>>>(c);
    CHECK(cudaGetLastError());
  }
}

void Sync(const Group& g) {
  for (auto s : g.streams) {
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "call failed: %s; status failed=%u rank=%u missing=0x%x epoch=%u "
                   "block=%u\n", cudaGetErrorString(e), g.status->failed, g.status->rank,
                   g.status->missing, g.status->epoch, g.status->block);
      std::exit(3);
    }
  }
}

// Element types on the host: float, or uint16_t holding bf16 bits.
template <typename T> struct Host;
template <> struct Host<float> {
  using H = float;
  static float ToF32(float v) { return v; }
  static float FromF32(float v) { return v; }
  static constexpr double kTolerance = 1e-5;
  static const char* Name() { return "f32"; }
};
template <> struct Host<__nv_bfloat16> {
  using H = uint16_t;
  static float ToF32(uint16_t v) { return xla_kernels::Bf16ToF32(v); }
  static uint16_t FromF32(float v) { return xla_kernels::F32ToBf16(v); }
  static constexpr double kTolerance = 1.0 / 64;
  static const char* Name() { return "bf16"; }
};

// One case: ranks, dtype, mode, fused (rows x hidden) or plain (n); `calls` calls with fresh
// inputs each. Returns the number of mismatches.
template <typename T>
int RunCase(Group& g, int mode, bool fused, int64_t rows, int64_t hidden, int64_t n, int calls,
            std::mt19937& rng) {
  using HostT = typename Host<T>::H;
  const int64_t count = fused ? rows * hidden : n;
  const int64_t width = fused ? hidden : int64_t{ar::kThreads} * ar::Pack<T>::kN;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<Buffers> buf(g.ranks);
  const size_t bytes = size_t(count) * sizeof(T);
  // Plain calls have no RMSNorm weight (hidden 0); one element keeps every buffer non-null.
  const size_t weight_count = size_t(hidden > 0 ? hidden : 1);
  for (auto& b : buf) {
    CHECK(cudaMalloc(&b.x, bytes));
    CHECK(cudaMalloc(&b.residual, bytes));
    CHECK(cudaMalloc(&b.weight, weight_count * sizeof(T)));
    CHECK(cudaMalloc(&b.out, bytes));
    CHECK(cudaMalloc(&b.residual_out, bytes));
  }
  int bad = 0;
  std::vector<std::vector<HostT>> x(g.ranks, std::vector<HostT>(count));
  std::vector<HostT> residual(count), weight(weight_count);
  for (auto& v : residual) v = Host<T>::FromF32(normal(rng));
  for (auto& v : weight) v = Host<T>::FromF32(1.f + 0.1f * normal(rng));
  for (int call = 0; call < calls; ++call) {
    for (int r = 0; r < g.ranks; ++r) {
      for (auto& v : x[r]) v = Host<T>::FromF32(normal(rng));
      CHECK(cudaMemcpy(buf[r].x, x[r].data(), bytes, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(buf[r].residual, residual.data(), bytes, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(buf[r].weight, weight.data(), weight.size() * sizeof(T),
                       cudaMemcpyHostToDevice));
      CHECK(cudaMemset(buf[r].out, 0xff, bytes));  // poisoned: NaN in every dtype
      CHECK(cudaMemset(buf[r].residual_out, 0xff, bytes));
    }
    CHECK(cudaDeviceSynchronize());
    Launch<T>(g, buf, mode, fused, count, width);
    Sync(g);
    std::vector<HostT> out0(count), out(count), res_out(count);
    for (int r = 0; r < g.ranks; ++r) {
      CHECK(cudaMemcpy(out.data(), buf[r].out, bytes, cudaMemcpyDeviceToHost));
      if (r == 0) out0 = out;
      if (std::memcmp(out.data(), out0.data(), bytes) != 0) {
        if (bad++ < 3) std::printf("  rank %d's out differs from rank 0's (call %d)\n", r, call);
      }
      if (fused) CHECK(cudaMemcpy(res_out.data(), buf[r].residual_out, bytes,
                                  cudaMemcpyDeviceToHost));
      for (int64_t row = 0; row < (fused ? rows : 1); ++row) {
        const int64_t begin = fused ? row * hidden : 0, end = fused ? begin + hidden : count;
        double squares = 0;
        std::vector<double> exact(size_t(end - begin));
        for (int64_t i = begin; i < end; ++i) {
          float sum = Host<T>::ToF32(x[0][i]);
          double sum64 = sum;
          for (int p = 1; p < g.ranks; ++p) {
            sum += Host<T>::ToF32(x[p][i]);
            sum64 += Host<T>::ToF32(x[p][i]);
          }
          if (!fused) {
            const HostT want = Host<T>::FromF32(sum);
            if (std::memcmp(&want, &out[i], sizeof(HostT)) != 0 && bad++ < 3)
              std::printf("  plain: rank %d element %lld: %g, host %g\n", r, (long long)i,
                          Host<T>::ToF32(out[i]), Host<T>::ToF32(want));
            continue;
          }
          const HostT r_want = Host<T>::FromF32(
              Host<T>::ToF32(Host<T>::FromF32(sum)) + Host<T>::ToF32(residual[i]));
          if (std::memcmp(&r_want, &res_out[i], sizeof(HostT)) != 0 && bad++ < 3)
            std::printf("  fused: rank %d residual_out %lld: %g, host %g\n", r, (long long)i,
                        Host<T>::ToF32(res_out[i]), Host<T>::ToF32(r_want));
          exact[size_t(i - begin)] = sum64 + Host<T>::ToF32(residual[i]);
          squares += exact[size_t(i - begin)] * exact[size_t(i - begin)];
        }
        if (!fused) continue;
        const double inv = 1.0 / std::sqrt(squares / double(hidden) + 1e-6);
        for (int64_t i = begin; i < end; ++i) {
          const double want = exact[size_t(i - begin)] * inv * Host<T>::ToF32(weight[i - begin]);
          const double got = Host<T>::ToF32(out[i]);
          if (!(std::fabs(got - want) <= Host<T>::kTolerance * (1 + std::fabs(want))) &&
              bad++ < 3)
            std::printf("  fused: rank %d out %lld: %g, float64 %g\n", r, (long long)i, got,
                        want);
        }
      }
    }
  }
  for (auto& b : buf) {
    CHECK(cudaFree(b.x));
    CHECK(cudaFree(b.residual));
    CHECK(cudaFree(b.weight));
    CHECK(cudaFree(b.out));
    CHECK(cudaFree(b.residual_out));
  }
  return bad;
}

int Check() {
  std::mt19937 rng(0);
  int failures = 0, cases = 0;
  for (int ranks : {2, 4}) {
    Group g = MakeGroup(ranks);
    for (int mode : {int(ar::kOneShot), int(ar::kTwoShot)}) {
      // Plain: odd sizes, a unit's tail, many units over few blocks.
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4096 * 8 + 3},
                        int64_t{(1 << 20) + 5}}) {
        const int f = RunCase<float>(g, mode, false, 0, 0, n, 3, rng) +
                      RunCase<__nv_bfloat16>(g, mode, false, 0, 0, n, 3, rng);
        ++cases;
        if (f) std::printf("FAIL ranks %d mode %d plain n %lld\n", ranks, mode, (long long)n);
        failures += f;
      }
      // Fused: rows of hidden, whole packs and not.
      for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{1, 4096}, {3, 4100}, {37, 7},
                                  {64, 8192}, {130, 1024}}) {
        const int f = RunCase<float>(g, mode, true, rows, hidden, 0, 3, rng) +
                      RunCase<__nv_bfloat16>(g, mode, true, rows, hidden, 0, 3, rng);
        ++cases;
        if (f) std::printf("FAIL ranks %d mode %d fused %lldx%lld\n", ranks, mode,
                           (long long)rows, (long long)hidden);
        failures += f;
      }
    }
  }
  std::printf("%d cases (f32 and bf16, 3 calls each), %d mismatches\n", cases, failures);
  return failures ? 1 : 0;
}

// Rank 1 never launches: rank 0 must trap within the timeout, its record naming rank 1.
int Hang() {
  Group g = MakeGroup(2);
  std::vector<Buffers> buf(2);
  for (auto& b : buf) {
    CHECK(cudaMalloc(&b.x, 4096));
    CHECK(cudaMalloc(&b.out, 4096));
    b.residual = b.weight = b.residual_out = nullptr;
  }
  Launch<float>(g, buf, ar::kOneShot, false, 1000, ar::kThreads * 4, /*skip=*/1,
                /*timeout_ns=*/200'000'000);
  const cudaError_t e = cudaStreamSynchronize(g.streams[0]);
  const ar::Status s = *g.status;
  std::printf("rank 0: %s; record: failed=%u rank=%u missing=0x%x epoch=%u block=%u\n",
              cudaGetErrorString(e), s.failed, s.rank, s.missing, s.epoch, s.block);
  const bool ok = e != cudaSuccess && s.failed == 1 && s.rank == 0 && s.missing == 0x2;
  std::printf("%s\n", ok ? "hang guard: rank 1 named" : "hang guard: FAIL");
  return ok ? 0 : 1;
}

int Time() {
  Group g = MakeGroup(2);
  for (int64_t bytes = 8 << 10; bytes <= kCapacity; bytes *= 4) {
    const int64_t n = bytes / 2;
    std::vector<Buffers> buf(2);
    for (auto& b : buf) {
      CHECK(cudaMalloc(&b.x, bytes));
      CHECK(cudaMalloc(&b.out, bytes));
      CHECK(cudaMemset(b.x, 0, bytes));
      b.residual = b.weight = b.residual_out = nullptr;
    }
    for (int i = 0; i < 20; ++i)
      Launch<__nv_bfloat16>(g, buf, ar::kOneShot, false, n, ar::kThreads * 8);
    Sync(g);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    constexpr int kCalls = 200;
    CHECK(cudaEventRecord(start, g.streams[0]));
    for (int i = 0; i < kCalls; ++i)
      Launch<__nv_bfloat16>(g, buf, ar::kOneShot, false, n, ar::kThreads * 8);
    CHECK(cudaEventRecord(stop, g.streams[0]));
    Sync(g);
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("one-shot, 2 ranks on one GPU, bf16, %8lld bytes: %.2f us per call\n",
                (long long)bytes, 1000.0 * ms / kCalls);
    for (auto& b : buf) {
      CHECK(cudaFree(b.x));
      CHECK(cudaFree(b.out));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "check";
  if (what == "check") return Check();
  if (what == "hang") return Hang();
  if (what == "time") return Time();
  std::fprintf(stderr, "usage: %s check|hang|time\n", argv[0]);
  return 2;
}
