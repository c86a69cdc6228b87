/* Dropout on a CPU in one pass: each element's keep flag is drawn from Philox4x64-10 at the element's global index
 * (the same stream numpy's Philox gives ntp.engine.dropout.philox_keep_mask, so both paths draw the same mask), and
 * the dropped, scaled (and optionally ReLU'd) value and the backward's mask are written as the flags are drawn.
 * Loaded with ctypes (no Python API): every call runs without the GIL. */
#include <stdint.h>
#include <string.h>

/* elements whose keep flags are drawn at once into a buffer that stays in L1 (a multiple of 256) */
#define CHUNK 4096
/* elementwise loops compiled for AVX-512, AVX2 and plain x86-64, chosen when the library loads */
#if defined(__x86_64__) && defined(__GNUC__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

typedef unsigned __int128 u128;

/* Philox4x64 with 10 rounds at the counter (counter, 0, 0, 0) and the key (key, 0), as numpy's Philox computes it */
static void philox(uint64_t counter, uint64_t key, uint64_t out[4]) {
    uint64_t c0 = counter, c1 = 0, c2 = 0, c3 = 0, k0 = key, k1 = 0;
    for (int round = 0; round < 10; round++) {
        u128 p0 = (u128)0xD2E7470EE14C6C93ULL * c0, p1 = (u128)0xCA5A826395121157ULL * c2;
        uint64_t n0 = (uint64_t)(p1 >> 64) ^ c1 ^ k0, n2 = (uint64_t)(p0 >> 64) ^ c3 ^ k1;
        c1 = (uint64_t)p1;
        c3 = (uint64_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B97F4A7C15ULL;
        k1 += 0xBB67AE8584CAA73BULL;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* byte v -> 8 bytes whose byte i is bit i of v */
static uint64_t spread[256];

__attribute__((constructor)) static void fill_spread(void) {
    for (int v = 0; v < 256; v++) {
        uint64_t s = 0;
        for (int i = 0; i < 8; i++) s |= (uint64_t)((v >> i) & 1) << (8 * i);
        spread[v] = s;
    }
}

/* Keep flags (0 or 1) of the global elements [first, first + n), n <= CHUNK. Philox block b (counter b + 1, as
 * numpy's generator counts) holds the 256 / bits elements from b * 256 / bits; a field at least threshold keeps. */
static void keep_flags(uint8_t *keep, int64_t first, int64_t n, uint64_t key, int bits, uint32_t threshold) {
    int64_t per = 256 / bits, b0 = first / per, b1 = (first + n - 1) / per;
    uint8_t drawn[CHUNK + 256];
    for (int64_t b = b0; b <= b1; b++) {
        uint64_t words[4];
        philox((uint64_t)b + 1, key, words);
        uint8_t *out = drawn + (b - b0) * per;
        const uint8_t *bytes = (const uint8_t *)words;
        const uint16_t *halves = (const uint16_t *)words;
        if (bits == 1)
            for (int i = 0; i < 32; i++) memcpy(out + 8 * i, &spread[bytes[i]], 8);
        else if (bits == 8)
            for (int i = 0; i < 32; i++) out[i] = bytes[i] >= threshold;
        else
            for (int i = 0; i < 16; i++) out[i] = halves[i] >= threshold;
    }
    memcpy(keep, drawn + (first - b0 * per), (size_t)n);
}

/* bfloat16 <-> float32 as torch converts (round to nearest even, one quiet NaN) */
static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return 0x7FC0;
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* 0 + (keep ? scale : 0) * x, the sum torch's masked scale takes (a dropped NaN stays NaN, a dropped -x is +0);
 * with relu, negatives become 0 and the mask is the nonzero results */
#define DROPPED(v, k, x) float v = 0.0f + ((k) ? scale : 0.0f) * (x); if (relu) v = v < 0.0f ? 0.0f : v

VECTOR_CLONES static void apply_f32(const float *x, float *y, uint8_t *mask, const uint8_t *keep, int64_t n,
                                    float scale, int relu) {
    for (int64_t i = 0; i < n; i++) {
        DROPPED(v, keep[i], x[i]);
        y[i] = v;
    }
    if (mask)
        for (int64_t i = 0; i < n; i++) mask[i] = relu ? y[i] != 0.0f : keep[i];
}

VECTOR_CLONES static void apply_bf16(const uint16_t *x, uint16_t *y, uint8_t *mask, const uint8_t *keep, int64_t n,
                                     float scale, int relu) {
    for (int64_t i = 0; i < n; i++) {
        DROPPED(v, keep[i], from_bf16(x[i]));
        y[i] = to_bf16(v);
    }
    if (mask)
        for (int64_t i = 0; i < n; i++) mask[i] = relu ? (y[i] & 0x7FFF) != 0 : keep[i];
}

/* Rows [0, rows) of x (row stride ldx) dropped into the contiguous y, and their backward mask into mask (contiguous;
 * NULL when no gradient is wanted). Element (i, j) is the global element first + i * width + j. */
static void dropout_rows(int dtype, const char *x, int64_t ldx, char *y, uint8_t *mask, int64_t rows, int64_t cols,
                         int64_t first, int64_t width, uint64_t key, int bits, uint32_t threshold, float scale,
                         int relu) {
    uint8_t keep[CHUNK];
    size_t item = dtype ? 2 : 4;
    if (ldx == cols && cols == width) { /* whole rows: one run of elements */
        cols *= rows;
        ldx = cols;
        rows = 1;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j += CHUNK) {
            int64_t n = cols - j < CHUNK ? cols - j : CHUNK, at = r * cols + j;
            const char *xs = x + (size_t)(r * ldx + j) * item;
            char *ys = y + (size_t)at * item;
            keep_flags(keep, first + r * width + j, n, key, bits, threshold);
            if (dtype)
                apply_bf16((const uint16_t *)xs, (uint16_t *)ys, mask ? mask + at : 0, keep, n, scale, relu);
            else
                apply_f32((const float *)xs, (float *)ys, mask ? mask + at : 0, keep, n, scale, relu);
        }
}

/* out = 0 + (mask ? scale : 0) * g over n contiguous elements */
VECTOR_CLONES static void masked_scale(int dtype, const char *g, const uint8_t *mask, char *out, int64_t n,
                                       float scale) {
    const int relu = 0;
    if (dtype) {
        const uint16_t *gs = (const uint16_t *)g;
        uint16_t *os = (uint16_t *)out;
        for (int64_t i = 0; i < n; i++) {
            DROPPED(v, mask[i], from_bf16(gs[i]));
            os[i] = to_bf16(v);
        }
    } else {
        const float *gs = (const float *)g;
        float *os = (float *)out;
        for (int64_t i = 0; i < n; i++) {
            DROPPED(v, mask[i], gs[i]);
            os[i] = v;
        }
    }
}

/* The entry points cut their rows (elements) into `parts` runs, one per thread of OpenMP's pool: torch's own pool
 * where torch loaded libgomp, so the kernel's threads are the ones torch's operators just left spinning, not
 * threads competing with them for the cores. dtype: 0 float32, 1 bfloat16. */

/* dropout_rows over rows [0, rows) of x */
void ntp_dropout(int parts, int dtype, const void *x, int64_t ldx, void *y, uint8_t *mask, int64_t rows, int64_t cols,
                 int64_t first, int64_t width, uint64_t key, int bits, uint32_t threshold, float scale, int relu) {
    size_t item = dtype ? 2 : 4;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int part = 0; part < parts; part++) {
        int64_t a = rows * part / parts, b = rows * (part + 1) / parts;
        dropout_rows(dtype, (const char *)x + (size_t)(a * ldx) * item, ldx, (char *)y + (size_t)(a * cols) * item,
                     mask ? mask + a * cols : 0, b - a, cols, first + a * width, width, key, bits, threshold, scale,
                     relu);
    }
}

/* the backward of ntp_dropout: masked_scale over n elements */
void ntp_masked_scale(int parts, int dtype, const void *g, const uint8_t *mask, void *out, int64_t n, float scale) {
    size_t item = dtype ? 2 : 4;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int part = 0; part < parts; part++) {
        int64_t a = n * part / parts, b = n * (part + 1) / parts;
        masked_scale(dtype, (const char *)g + (size_t)a * item, mask + a, (char *)out + (size_t)a * item, b - a, scale);
    }
}
