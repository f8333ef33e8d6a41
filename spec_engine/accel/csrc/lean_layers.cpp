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

#include <algorithm>
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

#if defined(__AVX512F__)
// Sixteen vectors -> one: lane i is the sum of a[i]'s sixteen lanes, by a fixed tree (halves, then quarters, then
// pairs of a 128-bit lane; the last permute puts the keys back in order). Each output lane reads only its own
// input vector, so a key's score never depends on the vectors beside it.
static inline __m512 sum_lanes16(const __m512* a) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++)        // t[i]: key 2i's 256-bit halves added (128-bit lanes 0, 1), key 2i + 1's (2, 3)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int j = 0; j < 4; j++)        // u[j]: 128-bit lane m holds key 4j + m's four partial sums
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * j], t[2 * j + 1], 0xDD));
  const __m512 v0 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  const __m512 v1 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
  const __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  // w's 128-bit lane m holds keys m, 8 + m, 4 + m, 12 + m
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, w);
}

// out[0..16) = q . keys[i] * scale for the first `count` (at most 16) keys, then zeros: one FMA chain per key over d
// in order, then sum_lanes16; keys past `count` count as zero vectors and are not read. Always inlined: with the
// count 16 known when compiling, the sixteen accumulators stay in registers (called, whole blocks cost 15% more).
static inline __attribute__((always_inline)) void score16(const float* q, const float* keys, int count, int D,
                                                          float scale, float* out) {
  __m512 acc[16];
  for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += VL) {
    const __m512 x = _mm512_loadu_ps(q + d);
    for (int i = 0; i < count; i++) acc[i] = _mm512_fmadd_ps(x, _mm512_loadu_ps(keys + (size_t)i * D + d), acc[i]);
  }
  _mm512_storeu_ps(out, _mm512_mul_ps(sum_lanes16(acc), _mm512_set1_ps(scale)));
}
#endif

// scores[j] = q . keys[j] * scale for j in 0..L-1 (keys [capacity][D]). With AVX-512, sixteen keys at a time
// (score16; the last block writes up to 16 entries: see attend's room); else four keys at a time, each chain reduced
// on its own. Either way a key's score depends only on q and that key.
static void score(const float* q, const float* keys, int L, int D, float scale, float* scores) {
  int j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= L; j += 16) score16(q, keys + (size_t)j * D, 16, D, scale, scores + j);
  if (j < L) score16(q, keys + (size_t)j * D, L - j, D, scale, scores + j);
#else
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
#endif
}

// One query's weighted values, over its list entries [i0, i1) (i0 even): even entries in one chain per vector, odd
// entries in another; the chains live in `even` / `odd` (NV vectors each) between calls, so a query's list can be
// taken in pieces, in order, with the same operations as in one go. NV vectors per value row (0: D / VL, known only
// at run time).
template <int NV_>
static void weigh(const float* w, const int* at, int i0, int i1, const float* values, int D, float* even, float* odd) {
  const int nv = NV_ ? NV_ : D / VL;
  vec e[NV_ ? NV_ : MAX_HEAD_DIM / VL], o[NV_ ? NV_ : MAX_HEAD_DIM / VL];
  for (int d = 0; d < nv; d++) e[d] = VLOAD(even + d * VL), o[d] = VLOAD(odd + d * VL);
  for (int i = i0; i + 2 <= i1; i += 2) {
    const vec w0 = VSET1(w[i]), w1 = VSET1(w[i + 1]);
    const float *v0 = values + (size_t)at[i] * D, *v1 = values + (size_t)at[i + 1] * D;
    for (int d = 0; d < nv; d++) e[d] = VFMA(w0, VLOAD(v0 + d * VL), e[d]);
    for (int d = 0; d < nv; d++) o[d] = VFMA(w1, VLOAD(v1 + d * VL), o[d]);
  }
  for (int d = 0; d < nv; d++) VSTORE(even + d * VL, e[d]), VSTORE(odd + d * VL, o[d]);
}

static void weigh_part(const float* w, const int* at, int i0, int i1, const float* values, int D, float* even,
                       float* odd) {
  switch (D / VL) {                     // the chains in registers for the usual head sizes
    case 1: weigh<1>(w, at, i0, i1, values, D, even, odd); break;
    case 2: weigh<2>(w, at, i0, i1, values, D, even, odd); break;
    case 4: weigh<4>(w, at, i0, i1, values, D, even, odd); break;
    case 8: weigh<8>(w, at, i0, i1, values, D, even, odd); break;
    default: weigh<0>(w, at, i0, i1, values, D, even, odd);
  }
}

#if defined(__AVX512F__)
#define VMAX(a, b) _mm512_max_ps(a, b)  // a > b ? a : b, lane by lane
#else
#define VMAX(a, b) _mm256_max_ps(a, b)
#endif

// The largest of s[0..m) (-inf when m is 0), as `top = x > top ? x : top` over them finds it: VL lanes each keep the
// largest of their entries (the same comparison, x first), then the lanes are compared. Only the order of the
// comparisons differs, which changes nothing but which of +0 and -0 a tie keeps (and exp(s - top) is the same for
// either).
static inline float largest(const float* s, int m) {
  float top = -INFINITY;
  int j = 0;
  if (m >= VL) {
    vec lanes = VSET1(-INFINITY);
    for (; j + VL <= m; j += VL) lanes = VMAX(VLOAD(s + j), lanes);
    float held[VL];
    VSTORE(held, lanes);
    for (int l = 0; l < VL; l++) top = held[l] > top ? held[l] : top;
  }
  for (; j < m; j++) top = s[j] > top ? s[j] : top;
  return top;
}

static const int KEY_CHUNK = 64;        // keys (list entries) a KV head's queries take in turn: 16 KB at D = 64, in L1

// Attention of `count` query rows of one KV head (keys/values [capacity][D] of positions 0..L-1, D a multiple of VL
// and at most MAX_HEAD_DIM): query u is q[u] (D floats), sees the positions where visible[u] is nonzero (or, with
// visible[u] null, those <= last[u]) and writes softmax(q.k * scale) . values to out[u]. Scratch: `scores` and `at`
// with room for count x (L rounded up to 16), `visible_count` and `inverse` for count, `chains` for count x 2 x D.
//
// The queries take the keys and values KEY_CHUNK at a time, all of them on one chunk before the next, so a chunk is
// read from L2 once per task and from L1 by the task's other queries, where each query used to stream them from L2
// on its own (2 threads, AMD EPYC: a forward of 8 rows after 400 cached tokens 14.44 -> 13.82 ms, after 100
// 11.05 -> 10.88 ms; a one-token step, whose tasks are single queries, unchanged).
//
// Batch invariance: each query's arithmetic is the same whatever the other queries are: its scores key by key
// (score: blocks of 16 from position 0, a chunk being whole blocks), the visible positions gathered in increasing
// order, and every later sum over that list by its index, never by a position's place in the cache: the softmax's
// total in 16 lanes (list entry i in lane i % 16), the values in two interleaved chains (even and odd entries, kept
// between chunks). A row sees the same list in a call of any row count, and a tree's node sees the same list as the
// chain of its path (its ancestors sit at other cache places, in the same order), so the numbers are bit for bit
// those of a one-token forward.
static void attend(int count, const float* const* q, const float* keys, const float* values, int L,
                   const unsigned char* const* visible, const int* last, int D, float scale, float* scores, int* at,
                   int* visible_count, float* inverse, float* chains, float* const* out) {
  const int room = (L + 15) / 16 * 16;
  for (int j0 = 0; j0 < L; j0 += KEY_CHUNK)
    for (int u = 0; u < count; u++)
      score(q[u], keys + (size_t)j0 * D, L - j0 < KEY_CHUNK ? L - j0 : KEY_CHUNK, D, scale,
            scores + (size_t)u * room + j0);
  int longest = 0;
  for (int u = 0; u < count; u++) {     // per query: the visible positions in order, softmax weights, cleared chains
    float* s = scores + (size_t)u * room;
    int* places = at + (size_t)u * room;
    // The leading run of visible positions (all of a causal row's, a tree row's cached text and root) is the list's
    // start as it stands: no test and no move there, and its largest score taken VL lanes at a time (this part's
    // thread time for a tree of 8 rows after 200 tokens: 0.67 -> 0.40 ms, bench/results/layer-phases-2threads.md).
    const unsigned char* zero = visible[u] ? (const unsigned char*)std::memchr(visible[u], 0, L) : nullptr;
    const int lead = visible[u] ? (zero ? (int)(zero - visible[u]) : L) : std::min(last[u] + 1, L);
    float top = largest(s, lead);
    for (int j = 0; j < lead; j++) places[j] = j;
    int m = lead;
    for (int j = lead; j < L; j++) {
      if (visible[u] ? !visible[u][j] : j > last[u]) continue;
      const float x = s[j];
      top = x > top ? x : top;
      s[m] = x;
      places[m++] = j;
    }
    const int padded = (m + 15) / 16 * 16;
    for (int i = m; i < padded; i++) s[i] = -INFINITY;
#pragma omp simd
    for (int i = 0; i < padded; i++) s[i] = expf(s[i] - top);  // the padding: exp(-inf) = 0
    float lanes[16] = {0.f};
    for (int i = 0; i < padded; i += 16)
      for (int l = 0; l < 16; l++) lanes[l] += s[i + l];
    float total = 0.f;
    for (int l = 0; l < 16; l++) total += lanes[l];
    visible_count[u] = m;
    longest = m > longest ? m : longest;
    std::memset(chains + (size_t)u * 2 * D, 0, 2 * D * sizeof(float));
    inverse[u] = 1.f / total;
  }
  for (int i0 = 0; i0 < longest; i0 += KEY_CHUNK)
    for (int u = 0; u < count; u++) {
      const int m = visible_count[u];
      if (i0 < m)
        weigh_part(scores + (size_t)u * room, at + (size_t)u * room, i0, m - i0 < KEY_CHUNK ? m : i0 + KEY_CHUNK,
                   values, D, chains + (size_t)u * 2 * D, chains + (size_t)u * 2 * D + D);
    }
  for (int u = 0; u < count; u++) {     // an odd list's last entry joins the even chain, then the two are added
    const int m = visible_count[u];
    float *even = chains + (size_t)u * 2 * D, *odd = even + D;
    const vec inv = VSET1(inverse[u]);
    if (m % 2) {
      const vec w0 = VSET1(scores[(size_t)u * room + m - 1]);
      const float* v0 = values + (size_t)at[(size_t)u * room + m - 1] * D;
      for (int d = 0; d < D; d += VL) VSTORE(even + d, VFMA(w0, VLOAD(v0 + d), VLOAD(even + d)));
    }
    for (int d = 0; d < D; d += VL) VSTORE(out[u] + d, VMUL(VADD(VLOAD(even + d), VLOAD(odd + d)), inv));
  }
}

// Many sequences' rows in one call (core/packed.py): hidden [n][H] holds `segments` runs of rows, run s being rows
// bounds[s] .. bounds[s + 1] - 1, placed after the starts[s] positions cached in its own KV buffers (layer l of run s:
// keys[s * n_layers + l], values[...], [Hkv][capacities[s * n_layers + l]][D], with room for starts[s] + its rows).
// visible[s] [rows of s][starts[s] + rows of s] (nonzero: the row sees that position) or null: causal. Products and
// norms run over all n rows at once (one read of each weight for the whole batch); each row attends only to its own
// run's cache. cos / sin [n][D]: each row's rotary table. captured [slots][n][H] receives the input rows of each
// layer whose `capture` is a slot. A row's arithmetic is the same whatever the other rows and runs are (see above),
// so a sequence in a batch gets, bit for bit, the numbers it gets alone.
struct Task {        // one attention task: `count` consecutive queries (row by row, then query head) of one KV head
  int segment, kv, u0, count;
};

extern "C" void lean_layers_packed(const LeanLayer* layers, int n_layers, int segments, const int* bounds,
                                   const int* starts, float* const* keys, float* const* values,
                                   const int* capacities, const unsigned char* const* visible, int H, int Hq, int Hkv,
                                   int D, int I, float eps, float scale, const float* cos, const float* sin,
                                   float* hidden, float* captured, int threads) {
  const int n = bounds[segments], qkv_width = (Hq + 2 * Hkv) * D, groups = Hq / Hkv;
  std::vector<float> normed((size_t)n * H), qkv((size_t)n * qkv_width), attended((size_t)n * Hq * D),
      delta((size_t)n * H), gate_up((size_t)n * 2 * I), act((size_t)n * I);
  // Attention tasks: per run, each KV head's rows x groups queries in `slices` runs of consecutive queries, enough
  // for every thread to have two or so (a one-row run: one query a task, its heads spread over the threads); tasks
  // go run by run and KV head by KV head, so a thread's tasks read few KV heads' keys and values. Scratch per thread,
  // for the largest task and the longest cache.
  const int teams = threads > 0 ? threads : 1;
  std::vector<Task> tasks;
  int most = 1, longest = 1;
  for (int g = 0; g < segments; g++) {
    const int rows = bounds[g + 1] - bounds[g], per_kv = rows * groups;
    const int slices = rows == 1 ? per_kv : std::min(per_kv, std::max(1, (2 * teams + Hkv - 1) / Hkv));
    for (int kv = 0; kv < Hkv; kv++)
      for (int slice = 0; slice < slices; slice++) {
        const int u0 = (int)((long)per_kv * slice / slices), count = (int)((long)per_kv * (slice + 1) / slices) - u0;
        tasks.push_back({g, kv, u0, count});
        most = std::max(most, count);
      }
    longest = std::max(longest, starts[g] + rows);
  }
  const int task_count = (int)tasks.size();
  const size_t room = (size_t)(longest + 15) / 16 * 16;
  std::vector<float> scores(teams * most * room), inverse(teams * most), chains(teams * most * 2 * (size_t)D);
  std::vector<int> places(scores.size()), counts(teams * most), lasts(teams * most);
  std::vector<const float*> queries(teams * most);
  std::vector<float*> outs(teams * most);
  std::vector<const unsigned char*> sees(teams * most);
  std::vector<int> run_of(n);
  for (int g = 0; g < segments; g++)
    for (int r = bounds[g]; r < bounds[g + 1]; r++) run_of[r] = g;
  for (int l = 0; l < n_layers; l++) {
    const LeanLayer& layer = layers[l];
    if (layer.capture >= 0)
      std::memcpy(captured + (size_t)layer.capture * n * H, hidden, (size_t)n * H * sizeof(float));
    rms_norm(hidden, layer.input_norm, normed.data(), n, H, eps);
    product(layer, normed.data(), layer.qkv, layer.qkv_bias, qkv.data(), n, H, qkv_width, threads);
    for (int r = 0; r < n; r++) {  // rotate queries and keys; append keys and values to the row's own cache
      const int g = run_of[r], at_layer = g * n_layers + l, place = starts[g] + r - bounds[g];
      float* row = qkv.data() + (size_t)r * qkv_width;
      for (int h = 0; h < Hq + Hkv; h++) rotate(row + h * D, cos + (size_t)r * D, sin + (size_t)r * D, D);
      for (int h = 0; h < Hkv; h++) {
        const size_t at = ((size_t)h * capacities[at_layer] + place) * D;
        std::memcpy(keys[at_layer] + at, row + (Hq + h) * D, D * sizeof(float));
        std::memcpy(values[at_layer] + at, row + (Hq + Hkv + h) * D, D * sizeof(float));
      }
    }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && task_count > 1)
    for (int t = 0; t < task_count; t++) {
      const Task task = tasks[t];
      const int g = task.segment, first = bounds[g], at_layer = g * n_layers + l, L = starts[g] + bounds[g + 1] - first;
      const size_t own = (size_t)omp_get_thread_num() * most;
      for (int u = 0; u < task.count; u++) {
        const int r = (task.u0 + u) / groups, h = task.kv * groups + (task.u0 + u) % groups;
        queries[own + u] = qkv.data() + (size_t)(first + r) * qkv_width + h * D;
        sees[own + u] = visible[g] ? visible[g] + (size_t)r * L : nullptr;
        lasts[own + u] = starts[g] + r;
        outs[own + u] = attended.data() + ((size_t)(first + r) * Hq + h) * D;
      }
      attend(task.count, queries.data() + own, keys[at_layer] + (size_t)task.kv * capacities[at_layer] * D,
             values[at_layer] + (size_t)task.kv * capacities[at_layer] * D, L, sees.data() + own,
             lasts.data() + own, D, scale, scores.data() + own * room, places.data() + own * room,
             counts.data() + own, inverse.data() + own, chains.data() + own * 2 * D, outs.data() + own);
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

// One sequence: hidden [n][H] (the rows' embeddings) -> the last layer's output rows, in place; rows are placed after
// the `start` cached positions of every layer (LeanLayer's own buffers), which must have room for start + n.
// visible [n][start + n] or null: causal. The one-run case of lean_layers_packed.
extern "C" void lean_layers(const LeanLayer* layers, int n_layers, int n, int start, int H, int Hq, int Hkv, int D,
                            int I, float eps, float scale, const float* cos, const float* sin,
                            const unsigned char* visible, float* hidden, float* captured, int threads) {
  std::vector<float*> keys(n_layers), values(n_layers);
  std::vector<int> capacities(n_layers);
  for (int l = 0; l < n_layers; l++) {
    keys[l] = layers[l].keys;
    values[l] = layers[l].values;
    capacities[l] = layers[l].capacity;
  }
  const int bounds[2] = {0, n};
  lean_layers_packed(layers, n_layers, 1, bounds, &start, keys.data(), values.data(), capacities.data(), &visible, H,
                     Hq, Hkv, D, I, eps, scale, cos, sin, hidden, captured, threads);
}

// A token tree's accepted path moved into place (core/cache.py keep_path): in each of `count` layers' key and value
// buffers [Hkv][capacity][D], position from[i] copied to to[i], i in order. The sources increase and to[i] <= from[i],
// so no source is overwritten before it is read, as in the gather-then-scatter of the torch code it replaces (one
// call for every layer where that code made four indexing operations a layer: ~0.35 ms a round on the offline
// default when the path moves).
extern "C" void move_positions(float* const* keys, float* const* values, const int* capacities, int count, int Hkv,
                               int D, const int* to, const int* from, int moves) {
  for (int l = 0; l < count; l++)
    for (int h = 0; h < Hkv; h++) {
      float* k = keys[l] + (size_t)h * capacities[l] * D;
      float* v = values[l] + (size_t)h * capacities[l] * D;
      for (int i = 0; i < moves; i++) {
        std::memmove(k + (size_t)to[i] * D, k + (size_t)from[i] * D, D * sizeof(float));
        std::memmove(v + (size_t)to[i] * D, v + (size_t)from[i] * D, D * sizeof(float));
      }
    }
}
