// fp32 products of a few rows with a packed weight, y = x W^T + b, for the decode steps of an AVX2 CPU.
//
// A decode step multiplies each projection's weight by as many rows as sequences are running: 1-64 in a
// request's tail or a small batch. On an AVX2-only AMD EPYC (Zen 3), one thread, this model's shapes
// (1024 -> 256..2816, 2816 -> 1024), MKL's fp32 GEMM ran such products at 6-48 GFLOP/s and oneDNN's at 5-57
// against a ceiling of 67-77: both library kernels are built for large products. This one keeps the weight in
// panels of 16 output columns, each panel's K rows of 16 floats contiguous (`pack_panels`, done once per
// weight load), and computes a block of up to 6 rows against one panel in 12 AVX2 registers: per k, two loads
// of the panel, one broadcast per row and two fused multiply-adds per row, the weight read from memory once per
// call whatever the rows (the panel stays in L2 while the row blocks pass over it). The rows are repacked per
// call into blocks of [K][rows] so that a block's broadcasts read one stream. With 1-3 rows the k loop keeps
// 2-4 partial sums per register so that the FMA latency does not bound it. Panels are split across threads.
// Sums run in another order than MKL's, so results agree to fp32 rounding, not bit for bit
// (tests/model/test_cpu_gemm.py). Without AVX2 and FMA the same layout runs plain loops (`vectorised_gemm()`
// says which was built; elr_rl/model/cpu_gemm.py uses the kernel only where it was vectorised).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kPanel = 16;   // output columns per panel
constexpr int64_t kRowBlock = 6; // rows per register block

#if defined(__AVX2__) && defined(__FMA__)
// C[r, 0:ncols] = sum_k A[k * MR + r] * P[k * 16 + j] (+ bias[j]); KS partial sums per accumulator.
template <int MR, int KS>
inline void block(const float* A, const float* P, int64_t K, float* C, int64_t ldc, int64_t ncols,
                  const float* bias) {
  __m256 lo[KS][MR], hi[KS][MR];
#pragma GCC unroll 8
  for (int s = 0; s < KS; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) lo[s][r] = hi[s][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + KS <= K; k += KS) {
#pragma GCC unroll 8
    for (int s = 0; s < KS; ++s) {
      const float* p = P + (k + s) * kPanel;
      const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_broadcast_ss(A + (k + s) * MR + r);
        lo[s][r] = _mm256_fmadd_ps(a, b0, lo[s][r]);
        hi[s][r] = _mm256_fmadd_ps(a, b1, hi[s][r]);
      }
    }
  }
  for (; k < K; ++k) {
    const float* p = P + k * kPanel;
    const __m256 b0 = _mm256_loadu_ps(p), b1 = _mm256_loadu_ps(p + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + k * MR + r);
      lo[0][r] = _mm256_fmadd_ps(a, b0, lo[0][r]);
      hi[0][r] = _mm256_fmadd_ps(a, b1, hi[0][r]);
    }
  }
#pragma GCC unroll 8
  for (int s = 1; s < KS; ++s)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      lo[0][r] = _mm256_add_ps(lo[0][r], lo[s][r]);
      hi[0][r] = _mm256_add_ps(hi[0][r], hi[s][r]);
    }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    if (ncols == kPanel) {
      if (bias != nullptr) {
        lo[0][r] = _mm256_add_ps(lo[0][r], _mm256_loadu_ps(bias));
        hi[0][r] = _mm256_add_ps(hi[0][r], _mm256_loadu_ps(bias + 8));
      }
      _mm256_storeu_ps(c, lo[0][r]);
      _mm256_storeu_ps(c + 8, hi[0][r]);
    } else {  // the last panel of a weight whose rows are not a multiple of 16
      alignas(32) float tmp[kPanel];
      _mm256_store_ps(tmp, lo[0][r]);
      _mm256_store_ps(tmp + 8, hi[0][r]);
      for (int64_t j = 0; j < ncols; ++j) c[j] = tmp[j] + (bias != nullptr ? bias[j] : 0.f);
    }
  }
}

template <int MR>
inline void rows(const float* A, const float* P, int64_t K, float* C, int64_t ldc, int64_t ncols, const float* bias) {
  // partial sums: 12 accumulators at 6 rows, 8 at 4-5; 1-3 rows would leave the FMA units waiting on latency
  constexpr int KS = MR == 1 ? 4 : (MR <= 3 ? 2 : 1);
  block<MR, KS>(A, P, K, C, ldc, ncols, bias);
}
#else
template <int MR>
inline void rows(const float* A, const float* P, int64_t K, float* C, int64_t ldc, int64_t ncols, const float* bias) {
  for (int r = 0; r < MR; ++r)
    for (int64_t j = 0; j < ncols; ++j) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += A[k * MR + r] * P[k * kPanel + j];
      C[r * ldc + j] = acc + (bias != nullptr ? bias[j] : 0.f);
    }
}
#endif

// Rows m0.. of one panel (up to kRowBlock at a time); A holds the rows packed by blocks.
void panel_rows(const float* A, int64_t M, int64_t K, const float* panel, float* C, int64_t N, int64_t ncols,
                const float* bias) {
  int64_t m = 0;
  for (; m + kRowBlock <= M; m += kRowBlock) rows<kRowBlock>(A + m * K, panel, K, C + m * N, N, ncols, bias);
  const float* a = A + m * K;
  float* c = C + m * N;
  switch (M - m) {
    case 1: rows<1>(a, panel, K, c, N, ncols, bias); break;
    case 2: rows<2>(a, panel, K, c, N, ncols, bias); break;
    case 3: rows<3>(a, panel, K, c, N, ncols, bias); break;
    case 4: rows<4>(a, panel, K, c, N, ncols, bias); break;
    case 5: rows<5>(a, panel, K, c, N, ncols, bias); break;
    default: break;
  }
}

}  // namespace

// x [M, K] fp32 times the weight packed by `pack_panels` ([ceil(N / 16), K, 16], zero-padded), plus bias [N].
torch::Tensor gemm_f32_panels(torch::Tensor x, torch::Tensor panels, int64_t n, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(),
              "x must be a 2-D fp32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == kPanel && panels.scalar_type() == torch::kFloat32 &&
                  panels.is_contiguous(),
              "panels must be a contiguous fp32 [ceil(N/16), K, 16] tensor (pack_panels), got ", panels.sizes());
  const int64_t M = x.size(0), K = x.size(1), NP = panels.size(0);
  TORCH_CHECK(panels.size(1) == K, "x has ", K, " columns but the packed weight ", panels.size(1));
  TORCH_CHECK(n > (NP - 1) * kPanel && n <= NP * kPanel, "n = ", n, " does not fit ", NP, " panels of 16");
  const float* B = nullptr;
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == torch::kFloat32 && b.numel() == n, "bias must be fp32 [", n, "]");
    B = b.data_ptr<float>();
  }
  auto out = torch::empty({M, n}, x.options());
  if (M == 0 || n == 0) return out;
  const torch::Tensor xc = x.contiguous();
  const float* X = xc.data_ptr<float>();
  // rows by blocks of kRowBlock: block b is [K][rows of b], so a block's broadcasts read one stream
  torch::Tensor packed = torch::empty({M * K}, x.options());
  float* A = packed.data_ptr<float>();
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t mr = std::min(kRowBlock, M - m0);
    float* dst = A + m0 * K;
    for (int64_t k = 0; k < K; ++k)
      for (int64_t r = 0; r < mr; ++r) dst[k * mr + r] = X[(m0 + r) * K + k];
  }
  const float* P = panels.data_ptr<float>();
  float* C = out.data_ptr<float>();
  at::parallel_for(0, NP, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t ncols = std::min(kPanel, n - p * kPanel);
      panel_rows(A, M, K, P + p * K * kPanel, C + p * kPanel, n, ncols, B != nullptr ? B + p * kPanel : nullptr);
    }
  });
  return out;
}

// Whether this build has the AVX2 + FMA kernel (else the plain loops: correct, far slower than MKL).
bool vectorised_gemm() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}
