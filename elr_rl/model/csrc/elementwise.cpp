// A bf16 decode step's RMSNorm and rotary embedding, each in one pass.
//
// PyTorch runs the model's RMSNorm, `(x.float() * rsqrt(mean(x.float()^2) + eps)).to(bf16) * w`, as seven
// kernels over fp32 temporaries, and its rotary embedding (`Rotary._rotate`) as eleven; at a decode step's
// sizes (a few hundred rows of 1024) that was 84-259 us per RMSNorm and 100-340 us per query rotation on one
// thread, a few percent of a step once every layer is counted. These loops compute the same values with the
// same roundings: fp32 arithmetic, each product and sum rounded as PyTorch's separate kernels round them
// (no fused multiply-add: this file is compiled with fp-contract off), bf16 rounding to nearest even at the
// same places. The one difference: RMSNorm's fp32 sum of squares is added in another order, which moves a
// bf16 output by one unit only when its fp32 value sits within ~1e-7 of a rounding boundary.
// tests/model/test_cpu_elementwise.py compares both with the PyTorch modules.
#pragma GCC optimize("fp-contract=off")
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, NaN kept a quiet NaN: c10::BFloat16's rounding.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return static_cast<uint16_t>(0x7fc0);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

#if defined(__AVX512F__)
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

inline __m512i bf16_bits(__m512 f) {  // rounded to nearest even, in the low 16 bits of each lane
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
}

inline void store_bf16(uint16_t* p, __m512 f) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(f)));
}

inline __m512 round_bf16(__m512 f) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(f), 16)); }
#endif

const uint16_t* bf16_data(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}

}  // namespace

// y = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w) over the last dimension: the model's RMSNorm on bf16 x, w.
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && weight.scalar_type() == torch::kBFloat16,
              "rms_norm_bf16: x and weight must be bfloat16");
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && weight.is_contiguous(), "rms_norm_bf16: contiguous tensors only");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d, "rms_norm_bf16: weight must be [", d, "]");
  torch::Tensor out = torch::empty_like(x);
  if (x.numel() == 0) return out;
  const int64_t rows = x.numel() / d;
  const uint16_t* xs = bf16_data(x);
  const uint16_t* ws = bf16_data(weight);
  uint16_t* ys = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* xr = xs + r * d;
      uint16_t* yr = ys + r * d;
      // Sixteen lane sums, then the lanes in order: the same order with or without AVX-512, so a machine's
      // ISA does not change the output (one running sum here moved 56 of 307,200 values against PyTorch's).
      float acc[16] = {0.0f};
      int64_t i = 0;
#if defined(__AVX512F__)
      __m512 vacc = _mm512_setzero_ps();
      for (; i + 16 <= d; i += 16) {
        const __m512 v = load_bf16(xr + i);
        vacc = _mm512_add_ps(vacc, _mm512_mul_ps(v, v));
      }
      _mm512_storeu_ps(acc, vacc);
#else
      for (; i + 16 <= d; i += 16)
        for (int l = 0; l < 16; ++l) {
          const float v = bf16_to_float(xr[i + l]);
          acc[l] += v * v;
        }
#endif
      float sum = 0.0f;
      for (int l = 0; l < 16; ++l) sum += acc[l];
      for (; i < d; ++i) {
        const float v = bf16_to_float(xr[i]);
        sum += v * v;
      }
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(d) + feps);
      int64_t j = 0;
#if defined(__AVX512F__)
      const __m512 vinv = _mm512_set1_ps(inv);
      for (; j + 16 <= d; j += 16)
        store_bf16(yr + j, _mm512_mul_ps(round_bf16(_mm512_mul_ps(load_bf16(xr + j), vinv)), load_bf16(ws + j)));
#endif
      for (; j < d; ++j) yr[j] = float_to_bf16(round_bf16(bf16_to_float(xr[j]) * inv) * bf16_to_float(ws[j]));
    }
  });
  return out;
}

// Neox rotary embedding of x [T, H, D] (bf16) on its first `rot` channels, with cos, sin [T, rot / 2] (fp32):
// out = [bf16(x1 cos - x2 sin), bf16(x2 cos + x1 sin), x[rot:]], x1 = x[:rot/2], x2 = x[rot/2:rot], as
// `Rotary._rotate` computes it.
torch::Tensor rotary_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t rot) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 3 && x.is_contiguous(),
              "rotary_bf16: x must be a contiguous bfloat16 [tokens, heads, head_dim]");
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = rot / 2;
  TORCH_CHECK(rot % 2 == 0 && rot > 0 && rot <= dim, "rotary_bf16: rot must be even, in 1..head_dim");
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous() && t->dim() == 2 && t->size(0) == tokens &&
                    t->size(1) == half,
                "rotary_bf16: cos and sin must be contiguous float32 [tokens, rot / 2]");
  torch::Tensor out = torch::empty_like(x);
  const uint16_t* xs = bf16_data(x);
  const float* cs = cos.data_ptr<float>();
  const float* sn = sin.data_ptr<float>();
  uint16_t* ys = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, tokens * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* c = cs + (row / heads) * half;
      const float* s = sn + (row / heads) * half;
      const uint16_t* xr = xs + row * dim;
      uint16_t* yr = ys + row * dim;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= half; i += 16) {
        const __m512 x1 = load_bf16(xr + i), x2 = load_bf16(xr + half + i);
        const __m512 vc = _mm512_loadu_ps(c + i), vs = _mm512_loadu_ps(s + i);
        store_bf16(yr + i, _mm512_sub_ps(_mm512_mul_ps(x1, vc), _mm512_mul_ps(x2, vs)));
        store_bf16(yr + half + i, _mm512_add_ps(_mm512_mul_ps(x2, vc), _mm512_mul_ps(x1, vs)));
      }
#endif
      for (; i < half; ++i) {
        const float x1 = bf16_to_float(xr[i]), x2 = bf16_to_float(xr[half + i]);
        const float a = x1 * c[i], b = x2 * s[i], e = x2 * c[i], f = x1 * s[i];
        yr[i] = float_to_bf16(a - b);
        yr[half + i] = float_to_bf16(e + f);
      }
      std::memcpy(yr + rot, xr + rot, sizeof(uint16_t) * (dim - rot));
    }
  });
  return out;
}
