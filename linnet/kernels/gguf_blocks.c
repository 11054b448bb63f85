/* GGUF's quantized blocks decoded to f32: what loading a llama.cpp file spends its time on; and f32
 * rounded to bf16, the type a decoded weight is then stored in.
 *
 * The gguf package's numpy decoders take about 7 ns a value on one core (an 8B model's Q4_K
 * weights, over a minute); these take well under one. Each type's arithmetic is the one ggml and
 * gguf's reference decoders do, in the same order, and the library is built with
 * -ffp-contract=off so that no multiply and add fuse: the values are theirs bit for bit, which
 * tests/kernels/test_gguf_blocks.py checks against gguf's decoders.
 *
 * Plain C, no vector intrinsics: it builds wherever there is a C compiler. One call decodes a run of
 * whole blocks on the calling thread; the caller splits a tensor's rows over threads (ctypes lets go
 * of the GIL for the call).
 */
#include <stdint.h>
#include <string.h>

/* ggml's type ids, as GGUF files store them. */
enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
       MXFP4 = 39 };

/* An IEEE half's bits as f32: exact, subnormals and infinities included. */
static float half(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0 && man == 0) {
        bits = sign;
    } else if (exp == 0) { /* subnormal: shift the leading one into the implicit bit */
        int shift = 0;
        while (!(man & 0x400)) {
            man <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3FF) << 13);
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Blocks of 32 hold 4-bit values as the low nibbles of 16 bytes (elements 0-15), then the high
 * ones (16-31). */
static void q4_0(const uint8_t *b, float *y) {
    float d = half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0xF) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void q4_1(const uint8_t *b, float *y) {
    float d = half(b), m = half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0xF) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0 and Q5_1: the fifth bit of element i is bit i of a little-endian 32-bit word. */
static uint32_t high_bits(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void q5_0(const uint8_t *b, float *y) {
    float d = half(b);
    uint32_t qh = high_bits(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(((qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16);
        y[j + 16] = d * (float)(((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16);
    }
}

static void q5_1(const uint8_t *b, float *y) {
    float d = half(b), m = half(b + 2);
    uint32_t qh = high_bits(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) + m;
        y[j + 16] = d * (float)((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) + m;
    }
}

static void q8_0(const uint8_t *b, float *y) {
    float d = half(b);
    for (int i = 0; i < 32; i++)
        y[i] = (float)(int8_t)b[2 + i] * d;
}

/* 256 values: 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit min; 2-bit values, four
 * to a byte, a byte's pairs of bits spread 32 elements apart. */
static void q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *qs = b + 16;
    float d = half(b + 80), dmin = half(b + 82), dl[16], ml[16];
    for (int s = 0; s < 16; s++) {
        dl[s] = d * (float)(scales[s] & 0xF);
        ml[s] = dmin * (float)(scales[s] >> 4);
    }
    for (int e0 = 0; e0 < 256; e0 += 32) { /* element e0 + l: bits 2 * (e0 % 128 / 32) of byte e0 / 128 * 32 + l */
        const uint8_t *q = qs + e0 / 128 * 32;
        int shift = 2 * (e0 % 128 / 32), s = e0 / 16;
        for (int l = 0; l < 32; l++)
            y[e0 + l] = dl[s + l / 16] * (float)((q[l] >> shift) & 3) - ml[s + l / 16];
    }
}

/* 256 values: 16 sub-blocks with 6-bit signed scales (low 4 bits in bytes 0-7, high 2 bits in
 * bytes 8-11); 2-bit values as Q2_K's, less 4 where the element's bit in `hmask` is clear. */
static void q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    float d = half(b + 108), dl[16];
    for (int s = 0; s < 16; s++) {
        int low = s < 8 ? sc[s] & 0xF : sc[s - 8] >> 4;
        int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        dl[s] = d * (float)((int8_t)(low | (high << 4)) - 32);
    }
    for (int e0 = 0; e0 < 256; e0 += 32) { /* as Q2_K, and hmask's bit e0 / 32 of byte l */
        const uint8_t *q = qs + e0 / 128 * 32;
        int shift = 2 * (e0 % 128 / 32), bit = e0 / 32, s = e0 / 16;
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 3) - ((((hmask[l] >> bit) & 1) ^ 1) << 2);
            y[e0 + l] = dl[s + l / 16] * (float)v;
        }
    }
}

/* Q4_K and Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min packed into 12 bytes. */
static void scale_min_k4(const uint8_t *s, int j, float d, float dmin, float *scale, float *min) {
    int sc, m;
    if (j < 4) {
        sc = s[j] & 0x3F;
        m = s[j + 4] & 0x3F;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 2) & 0x30);
        m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
    *scale = d * (float)sc;
    *min = dmin * (float)m;
}

static void q4_k(const uint8_t *b, float *y) {
    float d = half(b), dmin = half(b + 2);
    const uint8_t *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        float scale, min;
        scale_min_k4(b + 4, s, d, dmin, &scale, &min);
        for (int l = 0; l < 32; l++)
            y[s * 32 + l] = scale * (float)((qs[s / 2 * 32 + l] >> (4 * (s % 2))) & 0xF) - min;
    }
}

static void q5_k(const uint8_t *b, float *y) {
    float d = half(b), dmin = half(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        float scale, min;
        scale_min_k4(b + 4, s, d, dmin, &scale, &min);
        for (int l = 0; l < 32; l++) {
            int q = ((qs[s / 2 * 32 + l] >> (4 * (s % 2))) & 0xF) | (((qh[l] >> s) & 1) << 4);
            y[s * 32 + l] = scale * (float)q - min;
        }
    }
}

/* 256 values: 16 sub-blocks with 8-bit signed scales; 6-bit values, their low 4 bits in `ql`
 * (nibbles 64 elements apart) and high 2 in `qh` (bit pairs 32 elements apart), less 32. */
static void q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = half(b + 208), ds[16];
    for (int s = 0; s < 16; s++)
        ds[s] = d * (float)scales[s];
    for (int e0 = 0; e0 < 256; e0 += 32) { /* element e0 + l, r = e0 % 128 + l within its half */
        int r0 = e0 % 128, s = e0 / 16;
        const uint8_t *low = ql + e0 / 128 * 64 + r0 % 64, *high = qh + e0 / 128 * 32;
        int low_shift = 4 * (r0 / 64), high_shift = 2 * (r0 / 32);
        for (int l = 0; l < 32; l++) {
            int v = ((low[l] >> low_shift) & 0xF) | (((high[l] >> high_shift) & 3) << 4);
            y[e0 + l] = ds[s + l / 16] * (float)(v - 32);
        }
    }
}

/* gpt-oss's experts: 32 4-bit codes of the FP4 (E2M1) values, doubled, and one E8M0 exponent that
 * ggml halves to match. */
static void mxfp4(const uint8_t *b, float *y) {
    static const int8_t values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    uint32_t e = b[0], bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)values[b[1 + j] & 0xF];
        y[j + 16] = d * (float)values[b[1 + j] >> 4];
    }
}

typedef void (*decoder)(const uint8_t *, float *);

static int layout(int type, decoder *decode, long *values, long *bytes) {
    switch (type) {
    case Q4_0: *decode = q4_0; *values = 32; *bytes = 18; return 0;
    case Q4_1: *decode = q4_1; *values = 32; *bytes = 20; return 0;
    case Q5_0: *decode = q5_0; *values = 32; *bytes = 22; return 0;
    case Q5_1: *decode = q5_1; *values = 32; *bytes = 24; return 0;
    case Q8_0: *decode = q8_0; *values = 32; *bytes = 34; return 0;
    case Q2_K: *decode = q2_k; *values = 256; *bytes = 84; return 0;
    case Q3_K: *decode = q3_k; *values = 256; *bytes = 110; return 0;
    case Q4_K: *decode = q4_k; *values = 256; *bytes = 144; return 0;
    case Q5_K: *decode = q5_k; *values = 256; *bytes = 176; return 0;
    case Q6_K: *decode = q6_k; *values = 256; *bytes = 210; return 0;
    case MXFP4: *decode = mxfp4; *values = 32; *bytes = 17; return 0;
    default: return -1;
    }
}

/* (values, bytes) of one block of `type` packed as values * 65536 + bytes; 0 for a type not
 * decoded here. The caller checks it against gguf's table before trusting the library. */
long linnet_gguf_block(int type) {
    decoder decode;
    long values, bytes;
    return layout(type, &decode, &values, &bytes) ? 0 : values * 65536 + bytes;
}

/* n f32 values at src rounded to bf16 at dst: to nearest, ties to even, as torch rounds them; a NaN
 * stays a NaN (quiet). One plain pass on the calling thread: loading rounds each tensor as it is
 * read, and torch's own conversion, split over its threads, waited on a busy core at every tensor. */
void linnet_round_to_bf16(const float *src, uint16_t *dst, long n) {
    for (long i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, 4);
        /* both ways, then one chosen: a loop without branches, which the compiler vectorizes */
        uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u, rounded = u + 0x7fffu + ((u >> 16) & 1u);
        dst[i] = (uint16_t)((nan ? u | 0x400000u : rounded) >> 16);
    }
}

/* `blocks` blocks of `type` at src, decoded into dst; -1 for a type not decoded here. */
int linnet_gguf_decode(int type, const uint8_t *src, long blocks, float *dst) {
    decoder decode;
    long values, bytes;
    if (layout(type, &decode, &values, &bytes))
        return -1;
    for (long i = 0; i < blocks; i++)
        decode(src + i * bytes, dst + i * values);
    return 0;
}

/* `blocks` blocks of `type` at src, decoded and rounded to bf16 into dst: the bits
 * linnet_round_to_bf16 gives linnet_gguf_decode's values, in one pass (a block at a time through
 * a small f32 buffer, never the whole tensor in f32); -1 for a type not decoded here. */
int linnet_gguf_decode_bf16(int type, const uint8_t *src, long blocks, uint16_t *dst) {
    decoder decode;
    long values, bytes;
    float block[256]; /* the largest block's values (the K-quants') */
    if (layout(type, &decode, &values, &bytes) || values > 256)
        return -1;
    for (long i = 0; i < blocks; i++) {
        decode(src + i * bytes, block);
        linnet_round_to_bf16(block, dst + i * values, values);
    }
    return 0;
}
