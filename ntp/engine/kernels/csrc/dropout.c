/* Dropout on a CPU in one pass: element e's keep flag is a field of a counter-based stream of 64-bit words, each a
 * function of its index and the mask's key (ntp.engine.masks.stream_keep_mask draws the same words with numpy, so
 * both paths draw the same mask), and the dropped, scaled (and optionally ReLU'd) value and the backward's mask are
 * written as the fields are read. Loaded with ctypes (no Python API): every call runs without the GIL. */
#include <stdint.h>
#include <string.h>

/* elements whose keep fields are drawn at once into buffers that stay in L1 (a multiple of 64) */
#define CHUNK 4096
/* elementwise loops compiled for AVX-512 (x86-64-v4: with AVX512DQ's 64-bit multiply, which the stream's words take
 * three of: 0.27 ns a word here, 0.69 with AVX512F alone), AVX2 and plain x86-64, chosen when the library loads */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) /* older compilers: clones of named features only */
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

#define GOLDEN 0x9E3779B97F4A7C15ULL

/* Word w of the stream keyed by key: SplitMix64's output at w + 1 (its finaliser of key + (w + 1) * golden) */
static inline uint64_t stream_word(uint64_t w, uint64_t key) {
    uint64_t z = key + (w + 1) * GOLDEN;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* words [w0, w1) of the stream: independent of each other, so the loop is vectorised (Philox4x64-10, which this
 * replaced, took about twice as long a 16-bit field: its rounds depend on each other) */
VECTOR_CLONES static void stream_words(uint64_t *out, uint64_t w0, uint64_t w1, uint64_t key) {
    for (uint64_t w = w0; w < w1; w++) out[w - w0] = stream_word(w, key);
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

/* keep[i] = fields[i] >= threshold, vectorised (inlined into the plain x86-64 caller, they were not) */
VECTOR_CLONES static void at_least16(uint8_t *keep, const uint16_t *fields, int64_t n, uint32_t threshold) {
    for (int64_t i = 0; i < n; i++) keep[i] = fields[i] >= threshold;
}

VECTOR_CLONES static void at_least8(uint8_t *keep, const uint8_t *fields, int64_t n, uint32_t threshold) {
    for (int64_t i = 0; i < n; i++) keep[i] = fields[i] >= threshold;
}

/* Keep flags (0 or 1) of the global elements [first, first + n), n <= CHUNK: element e's field is the bits bits
 * from bit e * bits of the stream (little-endian words), and keeps where at least threshold. The words are drawn
 * first, then read as fields by loops the compiler vectorises. */
static void keep_flags(uint8_t *keep, uint64_t first, int64_t n, uint64_t key, int bits, uint32_t threshold) {
    uint64_t words[CHUNK / 4 + 2], w0 = first * bits / 64, w1 = ((first + n) * bits + 63) / 64;
    uint64_t skip = first - w0 * 64 / bits; /* fields of the first word before first */
    stream_words(words, w0, w1, key);
    if (bits == 16) {
        at_least16(keep, (const uint16_t *)words + skip, n, threshold);
    } else if (bits == 8) {
        at_least8(keep, (const uint8_t *)words + skip, n, threshold);
    } else {
        uint8_t spreads[CHUNK + 64];
        const uint8_t *packed = (const uint8_t *)words;
        for (uint64_t i = 0; i < (w1 - w0) * 8; i++) memcpy(spreads + 8 * i, &spread[packed[i]], 8);
        memcpy(keep, spreads + skip, (size_t)n);
    }
}

/* Keep flags saved packed, a bit an element (bit e % 8 of byte e / 8 is local element e), for a backward that reads
 * them instead of drawing the fields again. Byte-aligned runs go 8 flags at a time; a run's ragged ends bit by bit
 * (ntp_dropout cuts its threads' runs at whole bytes, so no two threads write one byte). */
static inline void pack_flag(uint8_t *bits, int64_t e, uint8_t flag) {
    bits[e / 8] = (uint8_t)((bits[e / 8] & ~(1u << (e % 8))) | ((unsigned)flag << (e % 8)));
}

static inline uint8_t packed_flag(const uint8_t *bits, int64_t e) { return (bits[e / 8] >> (e % 8)) & 1; }

static void pack_flags(uint8_t *bits, const uint8_t *keep, int64_t at, int64_t n) {
    int64_t i = 0;
    for (; i < n && (at + i) % 8; i++) pack_flag(bits, at + i, keep[i]);
    for (uint64_t v; i + 8 <= n; i += 8) { /* 8 flag bytes -> their bits: the product gathers bit 8j into bit 56 + j */
        memcpy(&v, keep + i, 8);
        bits[(at + i) / 8] = (uint8_t)((v * 0x0102040810204080ULL) >> 56);
    }
    for (; i < n; i++) pack_flag(bits, at + i, keep[i]);
}

static void unpack_flags(uint8_t *keep, const uint8_t *bits, int64_t at, int64_t n) {
    int64_t i = 0;
    for (; i < n && (at + i) % 8; i++) keep[i] = packed_flag(bits, at + i);
    for (; i + 8 <= n; i += 8) memcpy(keep + i, &spread[bits[(at + i) / 8]], 8);
    for (; i < n; i++) keep[i] = packed_flag(bits, at + i);
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
 * NULL when no gradient is wanted). Element (i, j) is the global element first + i * width + j. The keep flags are
 * drawn, or read from flags_in; flags_out, if given, keeps them packed (both indexed by local element, i * cols + j). */
static void dropout_rows(int dtype, const char *x, int64_t ldx, char *y, uint8_t *mask, uint8_t *flags_out,
                         const uint8_t *flags_in, int64_t rows, int64_t cols, int64_t first, int64_t width,
                         uint64_t key, int bits, uint32_t threshold, float scale, int relu) {
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
            if (flags_in)
                unpack_flags(keep, flags_in, at, n);
            else
                keep_flags(keep, first + r * width + j, n, key, bits, threshold);
            if (flags_out) pack_flags(flags_out, keep, at, n);
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

/* dropout_rows over rows [0, rows) of x; the packed flags (flags_out, flags_in: NULL where not wanted) start at a
 * whole byte */
void ntp_dropout(int parts, int dtype, const void *x, int64_t ldx, void *y, uint8_t *mask, uint8_t *flags_out,
                 const uint8_t *flags_in, int64_t rows, int64_t cols, int64_t first, int64_t width, uint64_t key,
                 int bits, uint32_t threshold, float scale, int relu) {
    size_t item = dtype ? 2 : 4;
    int64_t whole = 1; /* rows a thread's run is a multiple of: its packed flags then start at a whole byte */
    while ((whole * cols) % 8) whole++;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int part = 0; part < parts; part++) {
        int64_t a = rows * part / parts / whole * whole;
        int64_t b = part + 1 == parts ? rows : rows * (part + 1) / parts / whole * whole;
        dropout_rows(dtype, (const char *)x + (size_t)(a * ldx) * item, ldx, (char *)y + (size_t)(a * cols) * item,
                     mask ? mask + a * cols : 0, flags_out ? flags_out + a * cols / 8 : 0,
                     flags_in ? flags_in + a * cols / 8 : 0, b - a, cols, first + a * width, width, key, bits,
                     threshold, scale, relu);
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
