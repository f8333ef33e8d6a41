// A Llama decoder stack's forward over a few new rows (1-16), for the engine's fp32 CPU forwards
// (spec_engine/accel/native_layers.py builds this file on first use and explains why it exists).
//
// One call runs every layer: RMSNorm, the fused q|k|v product, the rotary embedding, the new keys and values written
// into the KV cache's buffers, attention over the cache (causal, or a token tree's visibility), the output product
// and the residual, RMSNorm, the fused gate|up product, SiLU(gate) * up, the down product and the residual. The
// products are blocked_gemm.cpp's kernel (included below), so each weight is read once per call whatever the rows.
//
// Batch invariance, as in the kernel: every output row is computed by the same operations in the same order whatever
// the other rows of the call are: norms and the rotary embedding per row, attention per (row, head) over the visible
// positions in increasing order. So a token verified in a tree gets the numbers a one-token forward gives it, bit for
// bit, and greedy speculative decoding emits plain decoding's tokens.
#include "blocked_gemm.cpp"

#include <omp.h>

#include <cmath>
#include <vector>

#if defined(__GLIBC__) && defined(__x86_64__) && !defined(__clang__)
// glibc's vector expf (libmvec, within 4 ulp), declared as its headers declare it under -ffast-math, which is not
// wanted here: the SiLU of a few rows is 1,536 exponentials a row and layer, most of this file's own time when scalar.
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));
#endif

// Pointers of one decoder layer: its weights packed for blocked_gemm (biases may be null), its norms' weights, and
// its KV cache's buffers [Hkv][capacity][D].
struct LeanLayer {
  const float* input_norm;
  const float* qkv;
  const float* qkv_bias;
  const float* o;
  const float* o_bias;
  const float* post_norm;
  const float* gate_up;
  const float* gate_up_bias;
  const float* down;
  const float* down_bias;
  float* keys;
  float* values;
  int capacity;
  int capture;  // the slot of `captured` that receives this layer's input rows, or -1
  int bf16;     // the four products' weights are bf16 (blocked_gemm_bf16's layout), else fp32
};

extern "C" int lean_layers_bf16() {  // whether this build multiplies bf16 weights (AVX-512 BF16)
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

static void product(const LeanLayer& layer, const float* x, const float* packed, const float* bias, float* y, int M,
                    int K, int N, int threads) {
#if defined(__AVX512BF16__)
  if (layer.bf16) {
    blocked_gemm_bf16(x, (const unsigned short*)packed, bias, y, M, K, N, threads);
    return;
  }
#endif
  blocked_gemm(x, packed, bias, y, M, K, N, threads);
}

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, per row (LlamaRMSNorm's arithmetic in fp32).
static void rms_norm(const float* x, const float* weight, float* out, int n, int H, float eps) {
  for (int r = 0; r < n; r++) {
    const float* row = x + (size_t)r * H;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int d = 0; d < H; d++) sum += row[d] * row[d];
    const float scale = 1.f / std::sqrt(sum / H + eps);
    float* dst = out + (size_t)r * H;
    for (int d = 0; d < H; d++) dst[d] = weight[d] * (row[d] * scale);
  }
}

// x[0..D) rotated at one position: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[D/2..D), x[0..D/2)).
static const int MAX_HEAD_DIM = 512;

static void rotate(float* x, const float* cos, const float* sin, int D) {
  const int half = D / 2;
  float tmp[MAX_HEAD_DIM];
  for (int d = 0; d < half; d++) tmp[d] = x[d] * cos[d] + (-x[d + half]) * sin[d];
  for (int d = half; d < D; d++) tmp[d] = x[d] * cos[d] + x[d - half] * sin[d];
  std::memcpy(x, tmp, D * sizeof(float));
}

static inline float sum_lanes(vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(v);
#else
  const __m128 pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
#endif
}

// One query row of one head over positions 0..L-1 of its KV head (keys/values [capacity][D], D a multiple of VL and
// at most MAX_HEAD_DIM): positions where `visible` is nonzero (or, with visible null, those <= last) take part;
// softmax(q.k * scale) weighs the values. Every step runs in a fixed order, whatever the other rows.
static void attend(const float* q, const float* keys, const float* values, int L, const unsigned char* visible,
                   int last, int D, float scale, float* scores, float* out) {
  int j = 0;
  for (; j + 4 <= L; j += 4) {          // four keys at a time: four independent FMA chains (each key's own order)
    const float *k0 = keys + (size_t)j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
    vec a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
    for (int d = 0; d < D; d += VL) {
      const vec x = VLOAD(q + d);
      a0 = VFMA(x, VLOAD(k0 + d), a0);
      a1 = VFMA(x, VLOAD(k1 + d), a1);
      a2 = VFMA(x, VLOAD(k2 + d), a2);
      a3 = VFMA(x, VLOAD(k3 + d), a3);
    }
    scores[j] = sum_lanes(a0) * scale;
    scores[j + 1] = sum_lanes(a1) * scale;
    scores[j + 2] = sum_lanes(a2) * scale;
    scores[j + 3] = sum_lanes(a3) * scale;
  }
  for (; j < L; j++) {
    const float* k = keys + (size_t)j * D;
    vec acc = VZERO();
    for (int d = 0; d < D; d += VL) acc = VFMA(VLOAD(q + d), VLOAD(k + d), acc);
    scores[j] = sum_lanes(acc) * scale;
  }
  float top = -INFINITY;                // every position up to L holds this call's keys; the hidden ones drop here
  for (j = 0; j < L; j++) {
    if (visible ? !visible[j] : j > last)
      scores[j] = -INFINITY;
    else if (scores[j] > top)
      top = scores[j];
  }
  const int padded = (L + 15) / 16 * 16;  // whole vectors only: a position's exp never depends on where the tail is
  for (j = L; j < padded; j++) scores[j] = -INFINITY;
#pragma omp simd
  for (int i = 0; i < padded; i++) scores[i] = expf(scores[i] - top);  // hidden positions: exp(-inf) = 0
  float total = 0.f;
  vec acc[MAX_HEAD_DIM / VL];
  for (int d = 0; d < D / VL; d++) acc[d] = VZERO();
  for (int j = 0; j < L; j++) {
    const float w = scores[j];
    if (w == 0.f) continue;
    total += w;
    const vec weight = VSET1(w);
    const float* v = values + (size_t)j * D;
    for (int d = 0; d < D / VL; d++) acc[d] = VFMA(weight, VLOAD(v + d * VL), acc[d]);
  }
  const vec inv = VSET1(1.f / total);
  for (int d = 0; d < D / VL; d++) VSTORE(out + d * VL, VMUL(acc[d], inv));
}

// hidden [n][H] (the rows' embeddings) -> the last layer's output rows, in place; rows are placed after the `start`
// cached positions of every layer, whose buffers must have room for start + n. cos / sin [n][D]: the rows' rotary
// tables (transformers' rotary embedding). visible [n][start + n] (nonzero: row i sees position j) or null: causal.
// captured [slots][n][H] receives the input rows of each layer whose `capture` is a slot.
extern "C" void lean_layers(const LeanLayer* layers, int n_layers, int n, int start, int H, int Hq, int Hkv, int D,
                            int I, float eps, float scale, const float* cos, const float* sin,
                            const unsigned char* visible, float* hidden, float* captured, int threads) {
  const int qkv_width = (Hq + 2 * Hkv) * D, L = start + n, groups = Hq / Hkv;
  std::vector<float> normed((size_t)n * H), qkv((size_t)n * qkv_width), attended((size_t)n * Hq * D),
      delta((size_t)n * H), gate_up((size_t)n * 2 * I), act((size_t)n * I),
      scores((size_t)(threads > 0 ? threads : 1) * ((L + 15) / 16 * 16));
  for (int l = 0; l < n_layers; l++) {
    const LeanLayer& layer = layers[l];
    if (layer.capture >= 0)
      std::memcpy(captured + (size_t)layer.capture * n * H, hidden, (size_t)n * H * sizeof(float));
    rms_norm(hidden, layer.input_norm, normed.data(), n, H, eps);
    product(layer, normed.data(), layer.qkv, layer.qkv_bias, qkv.data(), n, H, qkv_width, threads);
    for (int r = 0; r < n; r++) {  // rotate queries and keys; append keys and values to the cache
      float* row = qkv.data() + (size_t)r * qkv_width;
      for (int h = 0; h < Hq + Hkv; h++) rotate(row + h * D, cos + (size_t)r * D, sin + (size_t)r * D, D);
      for (int h = 0; h < Hkv; h++) {
        const size_t at = ((size_t)h * layer.capacity + start + r) * D;
        std::memcpy(layer.keys + at, row + (Hq + h) * D, D * sizeof(float));
        std::memcpy(layer.values + at, row + (Hq + Hkv + h) * D, D * sizeof(float));
      }
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n * Hq > 1)
    for (int task = 0; task < n * Hq; task++) {
      const int r = task / Hq, h = task % Hq, kv = h / groups;
      float* own = scores.data() + (size_t)omp_get_thread_num() * ((L + 15) / 16 * 16);
      attend(qkv.data() + (size_t)r * qkv_width + h * D, layer.keys + (size_t)kv * layer.capacity * D,
             layer.values + (size_t)kv * layer.capacity * D, L, visible ? visible + (size_t)r * L : nullptr,
             start + r, D, scale, own, attended.data() + ((size_t)r * Hq + h) * D);
    }
    product(layer, attended.data(), layer.o, layer.o_bias, delta.data(), n, Hq * D, H, threads);
    for (size_t i = 0; i < (size_t)n * H; i++) hidden[i] += delta[i];
    rms_norm(hidden, layer.post_norm, normed.data(), n, H, eps);
    product(layer, normed.data(), layer.gate_up, layer.gate_up_bias, gate_up.data(), n, H, 2 * I, threads);
    for (int r = 0; r < n; r++) {
      const float* gate = gate_up.data() + (size_t)r * 2 * I;
      const float* up = gate + I;
      float* dst = act.data() + (size_t)r * I;
#pragma omp simd
      for (int i = 0; i < I; i++) dst[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
    }
    product(layer, act.data(), layer.down, layer.down_bias, delta.data(), n, I, H, threads);
    for (size_t i = 0; i < (size_t)n * H; i++) hidden[i] += delta[i];
  }
}
