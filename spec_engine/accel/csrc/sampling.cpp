// Searches over float32 probability rows for the rounds on the CPU: the top-p members of warped rows, and the few
// largest entries of a row for the display (spec_engine/native.py builds this file on first use;
// spec_engine/sampling.py says why it exists).
//
// Top-p. The definition, the same as sampling.cpu_top_p_row's numpy code, bit for bit: sort a row's probabilities in
// descending order (ties by id, lower first), accumulate them in float32 in that order, and keep each token whose
// mass before it, (cum + p) - p as float32 arithmetic gives it, is below top_p. The members are renormalised by
// their mass summed in double, in that order. Only candidates are sorted: the tokens at or above the first floor
// whose sorted prefix already reaches top_p (then no token below the floor can be a member), else every token.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

const float FLOORS[] = {1.0f / 64, 1.0f / 1024, 1.0f / 16384};
const int N_FLOORS = 3;

typedef std::pair<float, int32_t> Entry;           // (probability, id)

// Sort `candidates` most likely first and mark the members; returns their count, or -1 when the candidates'
// mass never reaches top_p (the caller then widens the candidates).
int64_t select(std::vector<Entry>& candidates, float top_p, bool complete) {
    std::sort(candidates.begin(), candidates.end(), [](const Entry& a, const Entry& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    float cum = 0.0f;
    int64_t count = 0;
    for (const Entry& entry : candidates) {
        float through = cum + entry.first;
        float before = through - entry.first;    // the numpy code's (cumsum - values), which may differ from cum
        if (!(before < top_p)) return count;
        cum = through;
        ++count;
    }
    // Every candidate is a member: a token below the floor may be one too, unless the candidates are all tokens
    // or their mass reaches top_p (the next token's mass before it is then >= top_p).
    return (complete || !(cum < top_p)) ? count : -1;
}

// Append the tokens of `row` at or above `floor` to `candidates` (ids in order); returns their mass. Blocks of
// CHUNK tokens are skipped when their maximum is below the floor, which is most of a row: a vectorised max per
// block (omp simd: exact, unlike a vectorised sum) instead of a compare and branch per token.
const int64_t CHUNK = 64;

double gather(const float* row, int64_t vocab, float floor, std::vector<Entry>& candidates) {
    double mass = 0.0;
    for (int64_t start = 0; start < vocab; start += CHUNK) {
        const int64_t end = std::min(vocab, start + CHUNK);
        if (end - start == CHUNK) {
            const float* block = row + start;
            float top = -1.0f;
#pragma omp simd reduction(max : top)
            for (int64_t i = 0; i < CHUNK; ++i) top = block[i] > top ? block[i] : top;
            if (top < floor) continue;
        }
        for (int64_t i = start; i < end; ++i)
            if (row[i] >= floor) {
                candidates.emplace_back(row[i], (int32_t)i);
                mass += row[i];
            }
    }
    return mass;
}


// Softmax of logits / temperature. Written with GCC's vector extensions (16 lanes; the compiler maps them onto the
// machine's registers) because a vectorised exp is what makes it cheap, and libm's vector exp is reached only
// under -ffast-math, whose startup code would switch the whole process to flush-to-zero.
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
const int LANES = 16;

// exp(x) for x <= 0 (a logit minus the row's maximum): Cephes' expf, within ~1 ulp; 0 below -87.3 (2^-126).
inline vf splat(float value) {
    vf v;
    for (int i = 0; i < LANES; ++i) v[i] = value;
    return v;
}

inline vf exp_nonpositive(vf x) {
    const vf lowest = splat(-87.33654f);
    const vi underflow = x < lowest;
    x = x < lowest ? lowest : x;
    const vf magic = splat(12582912.0f);                  // 1.5 * 2^23: adding it rounds to an integer
    const vf n = (x * 1.44269504088896341f + magic) - magic;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf y = r * 1.9875691500e-4f + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    const vi exponent = (__builtin_convertvector(n, vi) + 127) << 23;   // 2^n, n in [-126, 0]
    vf scale;
    std::memcpy(&scale, &exponent, sizeof(scale));
    return underflow ? splat(0.0f) : y * scale;
}

inline vf load(const float* p, int64_t count, float fill) {    // count < LANES: the rest is `fill`
    vf v = {};
    for (int i = 0; i < LANES; ++i) v[i] = i < count ? p[i] : fill;
    return v;
}

// out [vocab] = softmax(logits / temperature), accumulated in float32 lanes. Multiplies by the reciprocals of the
// temperature and of the sum (a division per token cost as much as the exp); the maximum is taken over the logits
// (dividing by a positive temperature keeps the order).
void softmax_row(const float* logits, int64_t vocab, float temperature, float* out) {
    const int64_t whole = vocab - vocab % LANES;
    const float inverse = 1.0f / temperature;
    float top = -INFINITY;
#pragma omp simd reduction(max : top)
    for (int64_t i = 0; i < vocab; ++i) top = logits[i] > top ? logits[i] : top;
    top *= inverse;
    vf sums = {};
    for (int64_t i = 0; i < vocab; i += LANES) {
        const int64_t count = std::min<int64_t>(LANES, vocab - i);
        vf x;
        if (i < whole) std::memcpy(&x, logits + i, sizeof(x));
        else x = load(logits + i, count, -INFINITY);
        const vf e = exp_nonpositive(x * inverse - top);
        sums += e;
        if (i < whole) std::memcpy(out + i, &e, sizeof(e));
        else for (int64_t j = 0; j < count; ++j) out[i + j] = e[j];
    }
    float sum = 0.0f;
    for (int i = 0; i < LANES; ++i) sum += sums[i];
    const float scale = 1.0f / sum;
#pragma omp simd
    for (int64_t i = 0; i < vocab; ++i) out[i] *= scale;
}

}  // namespace

extern "C" {

// probs [rows][vocab] (read), out [rows][vocab] (written: zeros, members renormalised), ids [rows][cap] (each
// row's member ids, most likely first), counts [rows]. Returns 0, or the member count of the first row that
// does not fit in `cap` (nothing after that row is written; the caller calls again with a larger cap).
int64_t top_p_rows(const float* probs, int64_t rows, int64_t vocab, float top_p, float* out, int32_t* ids,
                   int64_t cap, int64_t* counts) {
    std::vector<Entry> candidates;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = probs + r * vocab;
        float* out_row = out + r * vocab;
        int64_t count = -1;
        for (int f = 0; f <= N_FLOORS && count < 0; ++f) {
            candidates.clear();
            const bool every = f == N_FLOORS;                    // past the floors: every token
            const double mass = gather(row, vocab, every ? -1.0f : FLOORS[f], candidates);
            if (!every && mass < top_p * 0.999) continue;          // clearly not enough: skip the sort
            count = select(candidates, top_p, every);
        }
        if (count > cap) return count;
        double sum = 0.0;              // in double: float32's running mass drifts over thousands of members
        for (int64_t j = 0; j < count; ++j) sum += candidates[j].first;
        const float total = (float)sum;
        std::memset(out_row, 0, sizeof(float) * vocab);
        for (int64_t j = 0; j < count; ++j) {
            out_row[candidates[j].second] = candidates[j].first / total;
            ids[r * cap + j] = candidates[j].second;
        }
        counts[r] = count;
    }
    return 0;
}

// warp's CPU path in one call: out [rows][vocab] = softmax(logits / temperature), then, when top_p < 1, the top-p
// search of top_p_rows in place (ids, counts, cap and the return value as there; counts are -1 without top-p).
int64_t warp_rows(const float* logits, int64_t rows, int64_t vocab, float temperature, float top_p, float* out,
                  int32_t* ids, int64_t cap, int64_t* counts) {
    for (int64_t r = 0; r < rows; ++r) {
        softmax_row(logits + r * vocab, vocab, temperature, out + r * vocab);
        counts[r] = -1;
    }
    return top_p < 1.0f ? top_p_rows(out, rows, vocab, top_p, out, ids, cap, counts) : 0;
}

// The largest entry of softmax(logits [vocab]) (a draft's confidence) through `prob`; returns its index (the first
// of equal maxima, as torch.argmax): a drafter's greedy pick and its confidence in one pass and an exp pass.
int64_t top_probability(const float* logits, int64_t vocab, double* prob) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
        if (logits[i] > logits[best]) best = i;
    const float top = logits[best];
    vf sums = {};
    for (int64_t i = 0; i < vocab; i += LANES) {
        const vf x = i + LANES <= vocab ? load(logits + i, LANES, 0.0f) : load(logits + i, vocab - i, -INFINITY);
        sums += exp_nonpositive(x - top);
    }
    float sum = 0.0f;
    for (int i = 0; i < LANES; ++i) sum += sums[i];
    *prob = 1.0 / sum;
    return best;
}

// The n largest entries of each row, most likely first, ties by id (lower first): ids [rows][n], values [rows][n].
// Needs n <= vocab. A block whose maximum does not beat the n-th largest so far is skipped whole (a later equal
// value would lose its tie), so a row costs about one vectorised pass.
void top_n_rows(const float* probs, int64_t rows, int64_t vocab, int64_t n, int64_t* ids, float* values) {
    std::vector<Entry> best;                        // sorted most likely first, at most n
    const auto before = [](const Entry& a, const Entry& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = probs + r * vocab;
        best.clear();
        for (int64_t start = 0; start < vocab; start += CHUNK) {
            const int64_t end = std::min(vocab, start + CHUNK);
            if ((int64_t)best.size() == n && end - start == CHUNK) {
                const float* block = row + start;
                float top = block[0];
#pragma omp simd reduction(max : top)
                for (int64_t i = 0; i < CHUNK; ++i) top = block[i] > top ? block[i] : top;
                if (!(top > best.back().first)) continue;
            }
            for (int64_t i = start; i < end; ++i) {
                const Entry entry(row[i], (int32_t)i);
                if ((int64_t)best.size() == n) {
                    if (!before(entry, best.back())) continue;
                    best.pop_back();
                }
                best.insert(std::upper_bound(best.begin(), best.end(), entry, before), entry);
            }
        }
        for (int64_t j = 0; j < n; ++j) {
            ids[r * n + j] = best[j].second;
            values[r * n + j] = best[j].first;
        }
    }
}

}  // extern "C"
