// Standalone check and timing of the skinny GEMM (gemm/skinny_kernel.cuh) on one GPU,
// against a naive f32 reference kernel and cuBLAS's bf16 GEMM, at Llama-3-8B's linears.
// Each timed call reads its own copy of the weight (copies together > 300 MB, so no call finds
// its weight in L2); 16 calls are captured in one CUDA graph and the graph is replayed.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//     -I src/xla_kernels/include benchmarks/gemm/skinny_gemm_check.cu -lcublas -o skinny_check
//   ./skinny_check            # prints one row per (weight, dtype, tokens)
#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#define HAVE_CUBLAS 1
#endif
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "xla_kernels/gemm/skinny_kernel.cuh"

#define CHECK(...)                                                                 \
  do {                                                                              \
    cudaError_t e_ = (__VA_ARGS__);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #__VA_ARGS__,             \
                   cudaGetErrorString(e_));                                         \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

namespace gemm = xla_kernels::gemm;
using bf16 = __nv_bfloat16;

__global__ void FillRandom(uint16_t* bits, int64_t n, uint32_t seed, bool fp8) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = (static_cast<float>(h & 0xffff) / 65535.f - 0.5f) * 2.f;
    if (fp8) {
      reinterpret_cast<uint8_t*>(bits)[i] =
          __nv_cvt_float_to_fp8(v * 200.f, __NV_SATFINITE, __NV_E4M3);
    } else {
      bf16 b = __float2bfloat16_rn(v);
      bits[i] = *reinterpret_cast<uint16_t*>(&b);
    }
  }
}

__device__ float WeightAt(const void* w, bool fp8, int64_t i) {
  if (fp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(w)[i], __NV_E4M3);
    return __half2float(__half(h));
  }
  return __bfloat162float(static_cast<const bf16*>(w)[i]);
}

__global__ void Reference(const bf16* x, const void* w, const float* scale, float* y, int64_t m,
                          int64_t n, int64_t k, bool fp8, int64_t bn, int64_t bk,
                          int64_t scale_cols) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= m * n) return;
  const int64_t t = i / n, o = i % n;
  double sum = 0;
  for (int64_t c = 0; c < k; ++c) {
    float wv = WeightAt(w, fp8, o * k + c);
    if (fp8) wv *= bk > 0 ? scale[(o / bn) * scale_cols + c / bk] : scale[o];
    sum += static_cast<double>(__bfloat162float(x[t * k + c])) * wv;
  }
  y[i] = static_cast<float>(sum);
}

struct Case {
  const char* name;
  int64_t n, k;
};

int main() {
  const Case cases[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096},
                        {"down", 4096, 14336}};
  const int64_t tokens_list[] = {1, 16, 64};
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
#ifdef HAVE_CUBLAS
  cublasHandle_t handle;
  cublasCreate(&handle);
  cublasSetStream(handle, stream);
#endif
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);

  // Copy bandwidth: a 1 GiB device-to-device copy, read + write bytes.
  {
    const size_t bytes = size_t{1} << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i) CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    cudaEventRecord(e0, stream);
    for (int i = 0; i < 10; ++i) CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    cudaEventRecord(e1, stream);
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    std::printf("copy bandwidth %.0f GB/s\n", 2.0 * bytes * 10 / (ms * 1e-3) / 1e9);
    cudaFree(a);
    cudaFree(b);
  }
  const double copy_gbs = [&] {
    const size_t bytes = size_t{1} << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, stream);
    for (int i = 0; i < 10; ++i) CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    cudaEventRecord(e1, stream);
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes * 10 / (ms * 1e-3) / 1e9;
  }();

  // Tiles and cluster sizes: the best split of each tile, per weight, dtype and M.
  for (const Case& cs : cases) {
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      const int64_t wbytes = cs.n * cs.k * (fp8 ? 1 : 2);
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{320} << 20) / wbytes + 1));
      std::vector<void*> ws(copies);
      for (auto& w : ws) {
        CHECK(cudaMalloc(&w, wbytes));
        FillRandom<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(w), cs.n * cs.k,
                                             static_cast<uint32_t>(reinterpret_cast<uintptr_t>(w)),
                                             fp8 != 0);
      }
      float* scale;
      CHECK(cudaMalloc(&scale, cs.n * 4));
      bf16 *x, *y;
      CHECK(cudaMalloc(&x, cs.k * 2 * 64));
      CHECK(cudaMalloc(&y, cs.n * 2 * 64));
      FillRandom<<<256, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(x), cs.k * 64, 99u, false);
      FillRandom<<<1024, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(scale), cs.n * 2, 5u, false);
      for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}}) {
        std::printf("%-8s %s M=%-3lld", cs.name, fp8 ? "e4m3" : "bf16", static_cast<long long>(m));
        auto sweep = [&](const char* label, auto launch_as) {
          double best = 1e30;
          int best_split = 0;
          for (int ms = 1; ms <= 8; ms *= 2) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < 16; ++i) {
              gemm::SkinnyParams p{};
              p.x = x; p.w = ws[i % copies]; p.scale = scale; p.y = y;
              p.tokens = m; p.k = cs.k; p.n = cs.n; p.bn = 1; p.bk = 0; p.scale_cols = 1;
              p.max_splits = ms;
              CHECK(launch_as(p, fp8 != 0));
            }
            CHECK(cudaStreamEndCapture(stream, &graph));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0, stream);
            for (int i = 0; i < 20; ++i) CHECK(cudaGraphLaunch(exec, stream));
            cudaEventRecord(e1, stream);
            CHECK(cudaEventSynchronize(e1));
            float ms_total = 0;
            cudaEventElapsedTime(&ms_total, e0, e1);
            const double us = ms_total * 1e3 / (20 * 16);
            if (us < best) { best = us; best_split = ms; }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
          }
          std::printf("  %s %.1fus %.0f%% s%d", label, best,
                      100.0 * wbytes / (copy_gbs * 1e3) / best, best_split);
        };
#define VARIANT(label, MF, NF, U, WARPS, STAGES, MINB)                                        \
  sweep(label, [&](const gemm::SkinnyParams& p, bool f8) {                                   \
    using Tile = gemm::SkinnyTile<MF, NF, U, WARPS, STAGES, MINB>;                           \
    return f8 ? gemm::LaunchSkinnyAs<bf16, uint8_t, Tile, false>(stream, p)                  \
              : gemm::LaunchSkinnyAs<bf16, bf16, Tile, false>(stream, p);                    \
  })
        if (m <= 16) {
          VARIANT("A", 1, 2, 4, 4, 4, 2);
          VARIANT("B", 1, 1, 4, 4, 8, 2);
          VARIANT("C", 1, 1, 4, 8, 6, 1);
          VARIANT("D", 1, 1, 2, 4, 8, 3);
          VARIANT("E", 1, 2, 4, 8, 4, 1);
        } else {
          VARIANT("A", 4, 2, 2, 4, 4, 2);
          VARIANT("B", 4, 1, 2, 4, 4, 2);
          VARIANT("C", 4, 1, 2, 8, 4, 1);
          VARIANT("D", 4, 2, 1, 4, 6, 2);
          VARIANT("E", 4, 4, 2, 4, 4, 2);
          VARIANT("F", 4, 4, 1, 4, 6, 2);
        }
#undef VARIANT
        std::printf("\n");
        std::fflush(stdout);
      }
      for (auto& w : ws) cudaFree(w);
      cudaFree(scale); cudaFree(x); cudaFree(y);
    }
  }
  std::printf("%-8s %-5s %-6s %4s %10s %8s %10s %8s %8s %10s\n", "weight", "w", "scale", "M",
              "ours_us", "ours_%", "cublas_us", "cublas_%", "ratio", "rel_err");
  for (const Case& cs : cases) {
    for (int mode = 0; mode < 3; ++mode) {  // bf16, fp8 per channel, fp8 128x128 blocks
      const bool fp8 = mode > 0, block = mode == 2;
      const int64_t wbytes = cs.n * cs.k * (fp8 ? 1 : 2);
      const int copies = static_cast<int>(std::max<int64_t>(2, (int64_t{320} << 20) / wbytes + 1));
      std::vector<void*> ws(copies);
      for (auto& w : ws) {
        CHECK(cudaMalloc(&w, wbytes));
        FillRandom<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(w), cs.n * cs.k,
                                             static_cast<uint32_t>(reinterpret_cast<uintptr_t>(w)),
                                             fp8);
      }
      const int64_t bn = block ? 128 : 0, bk = block ? 128 : 0;
      const int64_t scale_rows = block ? (cs.n + 127) / 128 : cs.n;
      const int64_t scale_cols = block ? (cs.k + 127) / 128 : 1;
      std::vector<float> hs(scale_rows * scale_cols);
      std::mt19937 rng(7);
      for (auto& v : hs) v = 0.5f + std::uniform_real_distribution<float>(0, 1)(rng) * 1e-2f;
      float* scale;
      CHECK(cudaMalloc(&scale, hs.size() * 4));
      CHECK(cudaMemcpy(scale, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
      for (int64_t m : tokens_list) {
        const int kChain = 16;
        std::vector<bf16*> xs(kChain), ys(kChain);
        for (int i = 0; i < kChain; ++i) {
          CHECK(cudaMalloc(&xs[i], m * cs.k * 2));
          CHECK(cudaMalloc(&ys[i], m * cs.n * 2));
          FillRandom<<<256, 256, 0, stream>>>(reinterpret_cast<uint16_t*>(xs[i]), m * cs.k,
                                              1234u + i, false);
        }
        auto params = [&](int i) {
          gemm::SkinnyParams p{};
          p.x = xs[i];
          p.w = ws[i % copies];
          p.scale = scale;
          p.y = ys[i];
          p.tokens = m;
          p.k = cs.k;
          p.n = cs.n;
          p.bn = block ? bn : 1;
          p.bk = bk;
          p.scale_cols = scale_cols;
          return p;
        };
        auto launch = [&](int i) {
          const gemm::SkinnyParams p = params(i);
          return fp8 ? gemm::LaunchSkinny<bf16, uint8_t>(stream, p, block)
                     : gemm::LaunchSkinny<bf16, bf16>(stream, p, false);
        };
        // Correctness: poisoned y, then the reference.
        CHECK(cudaMemsetAsync(ys[0], 0xff, m * cs.n * 2, stream));
        CHECK(launch(0));
        float* ref;
        CHECK(cudaMalloc(&ref, m * cs.n * 4));
        Reference<<<(m * cs.n + 255) / 256, 256, 0, stream>>>(xs[0], ws[0], scale, ref, m, cs.n,
                                                              cs.k, fp8, block ? bn : 1, bk,
                                                              scale_cols);
        CHECK(cudaStreamSynchronize(stream));
        std::vector<bf16> hy(m * cs.n);
        std::vector<float> hr(m * cs.n);
        CHECK(cudaMemcpy(hy.data(), ys[0], hy.size() * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hr.data(), ref, hr.size() * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < hy.size(); ++i) {
          const double d = static_cast<double>(__bfloat162float(hy[i])) - hr[i];
          num += std::isnan(d) ? 1e30 : d * d;
          den += static_cast<double>(hr[i]) * hr[i];
        }
        const double rel = std::sqrt(num / den);
        cudaFree(ref);

        auto time_graph = [&](auto&& body) {
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
          for (int i = 0; i < kChain; ++i) body(i);
          CHECK(cudaStreamEndCapture(stream, &graph));
          CHECK(cudaGraphInstantiate(&exec, graph, 0));
          for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
          cudaEvent_t e0, e1;
          cudaEventCreate(&e0);
          cudaEventCreate(&e1);
          std::vector<float> per;
          for (int r = 0; r < 5; ++r) {
            cudaEventRecord(e0, stream);
            for (int i = 0; i < 10; ++i) CHECK(cudaGraphLaunch(exec, stream));
            cudaEventRecord(e1, stream);
            CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            per.push_back(ms * 1e3f / (10 * kChain));
          }
          std::sort(per.begin(), per.end());
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
          return per[per.size() / 2];
        };
        const float ours = time_graph([&](int i) { CHECK(launch(i)); });
        float theirs = NAN;
#ifdef HAVE_CUBLAS
        if (!fp8) {
          const float alpha = 1.f, beta = 0.f;
          theirs = time_graph([&](int i) {
            cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(cs.n),
                         static_cast<int>(m), static_cast<int>(cs.k), &alpha, ws[i % copies],
                         CUDA_R_16BF, static_cast<int>(cs.k), xs[i], CUDA_R_16BF,
                         static_cast<int>(cs.k), &beta, ys[i], CUDA_R_16BF,
                         static_cast<int>(cs.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
          });
        }
#endif
        const double floor_us = static_cast<double>(wbytes) / (copy_gbs * 1e3);
        std::printf("%-8s %-5s %-6s %4lld %10.2f %7.1f%% %10.2f %7.1f%% %8.2f %10.2e\n", cs.name,
                    fp8 ? "e4m3" : "bf16", fp8 ? (block ? "block" : "chan") : "-",
                    static_cast<long long>(m), ours, 100 * floor_us / ours, theirs,
                    100 * floor_us / theirs, theirs / ours, rel);
        std::fflush(stdout);
        for (int i = 0; i < kChain; ++i) {
          cudaFree(xs[i]);
          cudaFree(ys[i]);
        }
      }
      for (auto& w : ws) cudaFree(w);
      cudaFree(scale);
    }
  }
  std::printf("copy bandwidth used for %%: %.0f GB/s\n", copy_gbs);
  return 0;
}
