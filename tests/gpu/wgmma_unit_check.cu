// Standalone check of cuda_wgmma.cuh's building blocks on an sm_90a GPU (no XLA, no JAX):
// one warpgroup computes
//   S = Q[64:128] K^T   (wgmma m64n64k16 x 8, Q 128 x 128 and K 64 x 128 in SW128 panels,
//                        both K-major: the S = Q K^T step of ragged_paged_attention_sm90.cuh)
//   O = P V             (wgmma m64n128k16 x 4 and m64n64k16 x 4, P 64 x 64 from registers,
//                        V 64 x 128 in SW128 panels as an MN-major operand: the PV step)
// and, in a second kernel, S = Q[64:128] K^T as issue_s of ragged_paged_attention_sm90.cuh
// computes it, with the kInit wrappers (first k-step kInit = true, the other 7 false):
//   mma_rs_m64n64k16_kmajor    Q from registers (the kernel's m16n8k16 A-fragment load from
//                              global), K 64 x 128 in SW128 panels of 64 rows (K-major)
//   mma_rs_m64n128k16_kmajor   the same with a 128-token K (panels of 128 rows)
//   mma_ss_m64n128k16_kmajor   Q[64:128] in SW128 panels of 64 rows (K-major) and the
//                              128-token K
//   mma_ss_m64n64k16_kmajor    Q[64:128] from the same panels and the 64-token K (the
//                              head_dim 256 kernel's S step, here over head_dim 128)
// where the accumulators hold 1e9f before the first (kInit) k-step, so a k-step that adds
// to D instead of overwriting it shows;
// for bf16 and f16 with small-integer inputs (exact in f32) and compares with the host.
//   nvcc -std=c++17 -O2 -arch=sm_90a -I src/xla_kernels/include tests/gpu/wgmma_unit_check.cu \
//        -o /tmp/wgmma_unit_check && /tmp/wgmma_unit_check
// Exit status 0 and "PASS" lines when every element matches.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "xla_kernels/cuda_mma.cuh"
#include "xla_kernels/cuda_wgmma.cuh"

namespace wg = xla_kernels::cuda_wgmma;
using xla_kernels::cuda_mma::pack2;

constexpr int kD = 128, kQRows = 128, kN = 64;
constexpr int kSmem = kQRows * kD * 2 + 2 * kN * kD * 2 + 1024;

// Stores a rows x kD row-major matrix (global) into SW128 panels at dst.
template <typename T>
__device__ void to_panels(unsigned char* dst, const T* src, int rows) {
  for (int c = threadIdx.x; c < rows * (kD / 8); c += blockDim.x) {
    const int r = c / (kD / 8), ch = c % (kD / 8);
    *reinterpret_cast<uint4*>(dst + (ch / 8) * rows * 128 + wg::sw128_offset(r, ch % 8)) =
        *reinterpret_cast<const uint4*>(src + r * kD + ch * 8);
  }
}

template <typename T>
__global__ void check_kernel(const T* q, const T* k, const float* p, const T* v, float* s_out,
                             float* o_out, float* o64_out) {
  extern __shared__ unsigned char sm_raw[];  // kSmem bytes; panels 1024-byte aligned
  unsigned char* qs = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(sm_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  unsigned char* ks = qs + kQRows * kD * 2;
  unsigned char* vs = ks + kN * kD * 2;
  to_panels(qs, q, kQRows);
  to_panels(ks, k, kN);
  to_panels(vs, v, kN);
  wg::fence_proxy_async();
  __syncthreads();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

  // S = Q[64:128] K^T.
  float s[32];
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  const uint32_t qa = wg::smem_u32(qs) + 64 * 128, ka = wg::smem_u32(ks);
  wg::fence_operands(s);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    wg::mma_ss_m64n64k16<T>(s, wg::sw128_desc(qa + (kk / 4) * kQRows * 128 + off, 16, 1024),
                            wg::sw128_desc(ka + (kk / 4) * kN * 128 + off, 16, 1024), 1);
  }
  wg::wgmma_commit();
  wg::fence_operands(s);
  wg::wgmma_wait<0>();
  wg::fence_operands(s);
  for (int i = 0; i < 8; ++i)
    for (int e = 0; e < 4; ++e)
      s_out[(warp * 16 + g + 8 * (e / 2)) * kN + 8 * i + 2 * t + (e & 1)] = s[4 * i + e];

  // P from global in the accumulator layout, then O = P V.
  float pf[32];
  for (int i = 0; i < 8; ++i)
    for (int e = 0; e < 4; ++e) pf[4 * i + e] = p[(warp * 16 + g + 8 * (e / 2)) * kN + 8 * i + 2 * t + (e & 1)];
  uint32_t pa[4][4];
  for (int j = 0; j < 4; ++j) {
    pa[j][0] = pack2<T>(pf[8 * j], pf[8 * j + 1]);
    pa[j][1] = pack2<T>(pf[8 * j + 2], pf[8 * j + 3]);
    pa[j][2] = pack2<T>(pf[8 * j + 4], pf[8 * j + 5]);
    pa[j][3] = pack2<T>(pf[8 * j + 6], pf[8 * j + 7]);
  }
  float o[64], o64[32];
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  for (int i = 0; i < 32; ++i) o64[i] = 0.f;
  const uint32_t va = wg::smem_u32(vs);
  wg::fence_operands(o);
  wg::fence_operands(o64);
  wg::wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wg::mma_rs_m64n128k16<T>(o, pa[j], wg::sw128_desc(va + j * 16 * 128, kN * 128, 1024), 1);
    // n64: only the first panel (columns 0..63) of V.
    wg::mma_rs_m64n64k16<T>(o64, pa[j], wg::sw128_desc(va + j * 16 * 128, kN * 128, 1024), 1);
  }
  wg::wgmma_commit();
  wg::fence_operands(o);
  wg::fence_operands(o64);
  wg::wgmma_wait<0>();
  wg::fence_operands(o);
  wg::fence_operands(o64);
  for (int i = 0; i < 16; ++i)
    for (int e = 0; e < 4; ++e)
      o_out[(warp * 16 + g + 8 * (e / 2)) * kD + 8 * i + 2 * t + (e & 1)] = o[4 * i + e];
  for (int i = 0; i < 8; ++i)
    for (int e = 0; e < 4; ++e)
      o64_out[(warp * 16 + g + 8 * (e / 2)) * 64 + 8 * i + 2 * t + (e & 1)] = o64[4 * i + e];
}

// S = Q[64:128] K^T with the K-major kInit wrappers (see the top of the file). q is Q
// (kQRows x kD), k64 a 64-token K, k128 a 128-token K (tokens x kD), all row-major; the
// outputs are 64 x 64 (s64_rs) and 64 x 128 (s128_rs, s128_ss), row-major.
constexpr float kPoison = 1e9f;  // in D before the kInit k-step: must not reach S
constexpr int kSmemKmajor = 64 * kD * 2 + 64 * kD * 2 + 128 * kD * 2 + 1024;

// Writes an m64nN accumulator (N / 2 registers, layout of cuda_wgmma.cuh) into out (64 x N).
template <int N>
__device__ void store_acc(const float (&d)[N / 2], float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < N / 8; ++i)
    for (int e = 0; e < 4; ++e)
      out[(warp * 16 + g + 8 * (e / 2)) * N + 8 * i + 2 * t + (e & 1)] = d[4 * i + e];
}

// S (64 x N) of one K tile: the accumulators poisoned, then k-steps 0 .. kD / 16 - 1 issued
// by mma(s, kk) (k-step 0 through a kInit wrapper, which must overwrite the poison),
// committed, waited for and stored into out.
template <int N, typename Mma>
__device__ __forceinline__ void s_tile(Mma mma, float* out) {
  float s[N / 2];
  for (int i = 0; i < N / 2; ++i) s[i] = kPoison;
  wg::fence_operands(s);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) mma(s, kk);
  wg::wgmma_commit();
  wg::fence_operands(s);
  wg::wgmma_wait<0>();
  wg::fence_operands(s);
  store_acc<N>(s, out);
}

template <typename T>
__global__ void kmajor_kernel(const T* q, const T* k64, const T* k128, float* s64_rs_out,
                              float* s128_rs_out, float* s128_ss_out, float* s64_ss_out) {
  extern __shared__ unsigned char sm_raw[];  // kSmemKmajor bytes; panels 1024-byte aligned
  unsigned char* qs = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(sm_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  unsigned char* k64s = qs + 64 * kD * 2;     // 2 panels of 64 rows (stride 64 * 128)
  unsigned char* k128s = k64s + 64 * kD * 2;  // 2 panels of 128 rows (stride 128 * 128)
  to_panels(qs, q + 64 * kD, 64);  // Q rows 64..127: 2 panels of 64 rows (stride 64 * 128)
  to_panels(k64s, k64, 64);
  to_panels(k128s, k128, 128);
  wg::fence_proxy_async();
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

  // Q in registers as ragged_paged_attention_sm90.cuh loads it: for k-step kk, the m16n8k16
  // A fragment of this warp's rows r0 = 64 + 16 warp + g and r0 + 8, i.e. the 32-bit words
  // (two values, the lower column in the low half) kk * 8 + t + 4 h = columns
  // 16 kk + 2 t + 8 h (+1): qf[kk][2h] of row r0, qf[kk][2h + 1] of row r0 + 8.
  const uint32_t* q0 = reinterpret_cast<const uint32_t*>(q + (64 + warp * 16 + g) * kD);
  const uint32_t* q1 = q0 + 8 * (kD / 2);
  uint32_t qf[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      qf[kk][2 * h] = q0[kk * 8 + t + 4 * h];
      qf[kk][2 * h + 1] = q1[kk * 8 + t + 4 * h];
    }
  const uint32_t qa = wg::smem_u32(qs), k64a = wg::smem_u32(k64s), k128a = wg::smem_u32(k128s);

  // RS, 64-token K: k-step kk's B at panel kk / 4 (stride 64 * 128), 32 bytes per k-step.
  s_tile<64>(
      [&](float (&s)[32], int kk) {
        const uint64_t db = wg::sw128_desc(k64a + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 1024);
        if (kk == 0) wg::mma_rs_m64n64k16_kmajor<T, true>(s, qf[kk], db);
        else wg::mma_rs_m64n64k16_kmajor<T, false>(s, qf[kk], db);
      },
      s64_rs_out);
  // RS, 128-token K: panels of 128 rows (stride 128 * 128).
  s_tile<128>(
      [&](float (&s)[64], int kk) {
        const uint64_t db =
            wg::sw128_desc(k128a + (kk / 4) * 128 * 128 + (kk % 4) * 32, 16, 1024);
        if (kk == 0) wg::mma_rs_m64n128k16_kmajor<T, true>(s, qf[kk], db);
        else wg::mma_rs_m64n128k16_kmajor<T, false>(s, qf[kk], db);
      },
      s128_rs_out);
  // SS, 128-token K: A = Q[64:128] from its panels of 64 rows (stride 64 * 128).
  s_tile<128>(
      [&](float (&s)[64], int kk) {
        const uint32_t off = (kk % 4) * 32;
        const uint64_t da = wg::sw128_desc(qa + (kk / 4) * 64 * 128 + off, 16, 1024);
        const uint64_t db = wg::sw128_desc(k128a + (kk / 4) * 128 * 128 + off, 16, 1024);
        if (kk == 0) wg::mma_ss_m64n128k16_kmajor<T, true>(s, da, db);
        else wg::mma_ss_m64n128k16_kmajor<T, false>(s, da, db);
      },
      s128_ss_out);
  // SS, 64-token K: A as above, B from the 64-row panels.
  s_tile<64>(
      [&](float (&s)[32], int kk) {
        const uint32_t off = (kk % 4) * 32;
        const uint64_t da = wg::sw128_desc(qa + (kk / 4) * 64 * 128 + off, 16, 1024);
        const uint64_t db = wg::sw128_desc(k64a + (kk / 4) * 64 * 128 + off, 16, 1024);
        if (kk == 0) wg::mma_ss_m64n64k16_kmajor<T, true>(s, da, db);
        else wg::mma_ss_m64n64k16_kmajor<T, false>(s, da, db);
      },
      s64_ss_out);
}

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                            \
    }                                                                          \
  } while (0)

template <typename T>
int run(const char* name) {
  std::srand(1234);
  auto rnd = [] { return static_cast<float>(std::rand() % 5 - 2); };
  std::vector<float> q(kQRows * kD), k(kN * kD), p(64 * kN), v(kN * kD);
  for (auto& x : q) x = rnd();
  for (auto& x : k) x = rnd();
  for (auto& x : p) x = rnd();
  for (auto& x : v) x = rnd();
  auto conv = [](const std::vector<float>& a) {
    std::vector<T> b(a.size());
    for (size_t i = 0; i < a.size(); ++i) b[i] = static_cast<T>(a[i]);
    return b;
  };
  std::vector<T> qh = conv(q), kh = conv(k), vh = conv(v);
  T *dq, *dk, *dv;
  float *dp, *ds, *dout, *dout64;
  CK(cudaMalloc(&dq, qh.size() * sizeof(T)));
  CK(cudaMalloc(&dk, kh.size() * sizeof(T)));
  CK(cudaMalloc(&dv, vh.size() * sizeof(T)));
  CK(cudaMalloc(&dp, p.size() * 4));
  CK(cudaMalloc(&ds, 64 * kN * 4));
  CK(cudaMalloc(&dout, 64 * kD * 4));
  CK(cudaMalloc(&dout64, 64 * 64 * 4));
  CK(cudaMemcpy(dq, qh.data(), qh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, kh.data(), kh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, vh.data(), vh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dp, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(check_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  check_kernel<T><<<1, 128, kSmem>>>(dq, dk, dp, dv, ds, dout, dout64);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> s(64 * kN), o(64 * kD), o64(64 * 64);
  CK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o64.data(), dout64, o64.size() * 4, cudaMemcpyDeviceToHost));
  int bad_s = 0, bad_o = 0, bad_o64 = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kN; ++c) {
      float ref = 0.f;
      for (int d = 0; d < kD; ++d) ref += q[(64 + r) * kD + d] * k[c * kD + d];
      if (s[r * kN + c] != ref && bad_s++ < 5)
        std::printf("  %s S[%d][%d] = %g, want %g\n", name, r, c, s[r * kN + c], ref);
    }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kD; ++c) {
      float ref = 0.f;
      for (int j = 0; j < kN; ++j) ref += p[r * kN + j] * v[j * kD + c];
      if (o[r * kD + c] != ref && bad_o++ < 5)
        std::printf("  %s O[%d][%d] = %g, want %g\n", name, r, c, o[r * kD + c], ref);
      if (c < 64 && o64[r * 64 + c] != ref && bad_o64++ < 5)
        std::printf("  %s O64[%d][%d] = %g, want %g\n", name, r, c, o64[r * 64 + c], ref);
    }
  std::printf("%s %s: S=QK^T m64n64k16 SS K-major: %d bad; O=PV m64n128k16 RS MN-major: %d bad; "
              "m64n64k16: %d bad\n", (bad_s || bad_o || bad_o64) ? "FAIL" : "PASS", name, bad_s,
              bad_o, bad_o64);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dp); cudaFree(ds); cudaFree(dout);
  cudaFree(dout64);
  return (bad_s || bad_o || bad_o64) ? 1 : 0;
}

// Compares a 64 x n S with Q[64:128] K^T (K n x kD); prints up to 5 mismatches.
static int count_bad_s(const char* name, const char* what, const std::vector<float>& s,
                       const std::vector<float>& q, const std::vector<float>& k, int n) {
  int bad = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < n; ++c) {
      float ref = 0.f;
      for (int d = 0; d < kD; ++d) ref += q[(64 + r) * kD + d] * k[c * kD + d];
      if (s[r * n + c] != ref && bad++ < 5)
        std::printf("  %s %s S[%d][%d] = %g, want %g\n", name, what, r, c, s[r * n + c], ref);
    }
  return bad;
}

template <typename T>
int run_kmajor(const char* name) {
  std::srand(4321);
  auto rnd = [] { return static_cast<float>(std::rand() % 5 - 2); };
  std::vector<float> q(kQRows * kD), k64(64 * kD), k128(128 * kD);
  for (auto& x : q) x = rnd();
  for (auto& x : k64) x = rnd();
  for (auto& x : k128) x = rnd();
  auto conv = [](const std::vector<float>& a) {
    std::vector<T> b(a.size());
    for (size_t i = 0; i < a.size(); ++i) b[i] = static_cast<T>(a[i]);
    return b;
  };
  std::vector<T> qh = conv(q), k64h = conv(k64), k128h = conv(k128);
  T *dq, *dk64, *dk128;
  float *ds64, *ds128rs, *ds128ss, *ds64ss;
  CK(cudaMalloc(&dq, qh.size() * sizeof(T)));
  CK(cudaMalloc(&dk64, k64h.size() * sizeof(T)));
  CK(cudaMalloc(&dk128, k128h.size() * sizeof(T)));
  CK(cudaMalloc(&ds64, 64 * 64 * 4));
  CK(cudaMalloc(&ds128rs, 64 * 128 * 4));
  CK(cudaMalloc(&ds128ss, 64 * 128 * 4));
  CK(cudaMalloc(&ds64ss, 64 * 64 * 4));
  CK(cudaMemcpy(dq, qh.data(), qh.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk64, k64h.data(), k64h.size() * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk128, k128h.data(), k128h.size() * sizeof(T), cudaMemcpyHostToDevice));
  // Outputs start as NaN so that an element the kernel does not write fails.
  CK(cudaMemset(ds64, 0xFF, 64 * 64 * 4));
  CK(cudaMemset(ds128rs, 0xFF, 64 * 128 * 4));
  CK(cudaMemset(ds128ss, 0xFF, 64 * 128 * 4));
  CK(cudaMemset(ds64ss, 0xFF, 64 * 64 * 4));
  CK(cudaFuncSetAttribute(kmajor_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kSmemKmajor));
  kmajor_kernel<T><<<1, 128, kSmemKmajor>>>(dq, dk64, dk128, ds64, ds128rs, ds128ss,
                                                    ds64ss);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> s64(64 * 64), s128rs(64 * 128), s128ss(64 * 128), s64ss(64 * 64);
  CK(cudaMemcpy(s64.data(), ds64, s64.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s128rs.data(), ds128rs, s128rs.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s128ss.data(), ds128ss, s128ss.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(s64ss.data(), ds64ss, s64ss.size() * 4, cudaMemcpyDeviceToHost));
  const int bad64 = count_bad_s(name, "RS n64", s64, q, k64, 64);
  const int bad128rs = count_bad_s(name, "RS n128", s128rs, q, k128, 128);
  const int bad128ss = count_bad_s(name, "SS n128", s128ss, q, k128, 128);
  const int bad64ss = count_bad_s(name, "SS n64", s64ss, q, k64, 64);
  const bool fail = bad64 || bad128rs || bad128ss || bad64ss;
  std::printf("%s %s: S=QK^T K-major kInit (D poisoned): m64n64k16 RS: %d bad; "
              "m64n128k16 RS: %d bad; m64n128k16 SS: %d bad; m64n64k16 SS: %d bad\n",
              fail ? "FAIL" : "PASS", name, bad64, bad128rs, bad128ss, bad64ss);
  cudaFree(dq); cudaFree(dk64); cudaFree(dk128); cudaFree(ds64); cudaFree(ds128rs);
  cudaFree(ds128ss); cudaFree(ds64ss);
  return fail ? 1 : 0;
}

int main() {
  int dev = 0, major = 0, minor = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) {
    std::printf("SKIP: compute capability %d.%d, wgmma (sm_90a) needs 9.0\n", major, minor);
    return 0;
  }
  int fails = run<__nv_bfloat16>("bf16") + run<__half>("f16");
  fails += run_kmajor<__nv_bfloat16>("bf16") + run_kmajor<__half>("f16");
  return fails ? 1 : 0;
}
