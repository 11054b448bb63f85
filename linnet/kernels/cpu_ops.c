/* The small ops of a pass on the CPU, one call each: RMSNorm, LayerNorm, rotary embedding, the cache
 * write, and the elementwise ops and embedding gather that a replayed decode step (cpu_graph.c) runs.
 *
 * In eager torch each is several aten ops with a dtype conversion or two (rmsnorm eight, rope
 * six, the cache write a mask, an index and a scatter), about 20 us a call at one decode row,
 * where the arithmetic takes well under one: SmolLM2's 30 layers call them 241 times a step.
 * Here each reads its input once and writes its output once, rounding where the reference
 * (codegen_torch/runtime.py) rounds, so a result differs from torch's only in the order of
 * the f32 sum inside a norm (and SiLU's exponential, kernels.h's exp8, within 2 ulp of expf).
 *
 * Activations and weights are f32, bf16 or f16 (kernels.h's type codes); every value is
 * computed in f32 and rounded to nearest, ties to even, where it is stored.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Work below this many elements runs on the calling thread: waking helpers costs more than it. */
#define PARALLEL_FROM 32768

/* An op's rows [i0, i1), given its arguments. */
typedef void (*rows_fn)(const void *args, long i0, long i1);

struct rows_job {
    rows_fn rows;
    const void *args;
    long n;
};

static int rows_chunk(void *data, long c, long chunks) {
    const struct rows_job *job = data;
    job->rows(job->args, job->n * c / chunks, job->n * (c + 1) / chunks);
    return 0;
}

/* rows(args, 0, n) in runs on `threads` threads (pool.c's) where the op is large (`size`
 * elements), else on this one. */
static void over_rows(rows_fn rows, const void *args, long n, long size, int threads) {
    struct rows_job job = {rows, args, n};
    if (size < PARALLEL_FROM || threads <= 1 || linnet_parallel(rows_chunk, &job, n < threads ? n : threads, threads))
        rows(args, 0, n); /* (linnet_parallel fails only before any chunk ran: out of memory) */
}

/* out [n, d] (out_type) = w * round_x(x * rsqrt(mean(x^2) + eps)), row by row; x [n, d] (x_type)
 * with rows x_stride elements apart, w [d] (w_type). */
struct rmsnorm_args {
    int x_type, w_type, out_type;
    const void *x, *w;
    long x_stride, d;
    float eps;
    void *out;
};

static AVX2 void rmsnorm_rows(const void *args, long i0, long i1) {
    const struct rmsnorm_args *a = args;
    int x_type = a->x_type, w_type = a->w_type, out_type = a->out_type;
    const void *x = a->x, *w = a->w;
    long x_stride = a->x_stride, d = a->d, d8 = d / 8 * 8;
    float eps = a->eps;
    void *out = a->out;
    for (long i = i0; i < i1; i++) {
        long in = i * x_stride, o = i * d;
        __m256 acc = _mm256_setzero_ps();
        for (long j = 0; j < d8; j += 8) {
            __m256 v = load8(x, x_type, in + j);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float sum = hsum8(acc);
        for (long j = d8; j < d; j++) {
            float v = load1(x, x_type, in + j);
            sum += v * v;
        }
        float r = 1.0f / sqrtf(sum / (float)d + eps);
        __m256 r8 = _mm256_set1_ps(r);
        for (long j = 0; j < d8; j += 8)
            store8(out, out_type, o + j,
                   _mm256_mul_ps(load8(w, w_type, j), round8(x_type, _mm256_mul_ps(load8(x, x_type, in + j), r8))));
        for (long j = d8; j < d; j++)
            store1(out, out_type, o + j, load1(w, w_type, j) * round_to(x_type, load1(x, x_type, in + j) * r));
    }
}

void linnet_rmsnorm(int x_type, const void *x, long x_stride, long n, long d, int w_type, const void *w, float eps,
                    int out_type, void *out, int threads) {
    struct rmsnorm_args args = {x_type, w_type, out_type, x, w, x_stride, d, eps, out};
    over_rows(rmsnorm_rows, &args, n, n * d, threads);
}

/* out [n, d] (x's type) = (x - mean) / sqrt(var + eps) * w + b, row by row, as torch's F.layer_norm:
 * the mean and the (biased) variance in f32 whatever x's type, w and b applied in f32, the output
 * rounded once. x [n, d] (x_type) has rows x_stride elements apart; w and b [d] (w_type) may each be
 * NULL (absent). The variance is the mean of (x - mean)^2, a second pass over the row (in cache),
 * not mean(x^2) - mean^2, which cancels where the mean is large against the spread. */
struct layer_norm_args {
    int x_type, w_type;
    const void *x, *w, *b;
    long x_stride, d;
    float eps;
    void *out;
};

static AVX2 void layer_norm_rows(const void *args, long i0, long i1) {
    const struct layer_norm_args *a = args;
    int x_type = a->x_type, w_type = a->w_type;
    const void *x = a->x, *w = a->w, *b = a->b;
    long x_stride = a->x_stride, d = a->d, d8 = d / 8 * 8;
    void *out = a->out;
    for (long i = i0; i < i1; i++) {
        long in = i * x_stride, o = i * d;
        __m256 acc = _mm256_setzero_ps();
        for (long j = 0; j < d8; j += 8)
            acc = _mm256_add_ps(acc, load8(x, x_type, in + j));
        float sum = hsum8(acc);
        for (long j = d8; j < d; j++)
            sum += load1(x, x_type, in + j);
        float mean = sum / (float)d;
        __m256 mean8 = _mm256_set1_ps(mean);
        acc = _mm256_setzero_ps();
        for (long j = 0; j < d8; j += 8) {
            __m256 c = _mm256_sub_ps(load8(x, x_type, in + j), mean8);
            acc = _mm256_fmadd_ps(c, c, acc);
        }
        float squares = hsum8(acc);
        for (long j = d8; j < d; j++) {
            float c = load1(x, x_type, in + j) - mean;
            squares += c * c;
        }
        float r = 1.0f / sqrtf(squares / (float)d + a->eps);
        __m256 r8 = _mm256_set1_ps(r), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (long j = 0; j < d8; j += 8) {
            __m256 h = _mm256_mul_ps(_mm256_sub_ps(load8(x, x_type, in + j), mean8), r8);
            h = _mm256_fmadd_ps(h, w ? load8(w, w_type, j) : one, b ? load8(b, w_type, j) : zero);
            store8(out, x_type, o + j, h);
        }
        for (long j = d8; j < d; j++) {
            float h = (load1(x, x_type, in + j) - mean) * r;
            store1(out, x_type, o + j, h * (w ? load1(w, w_type, j) : 1.0f) + (b ? load1(b, w_type, j) : 0.0f));
        }
    }
}

void linnet_layer_norm(int x_type, const void *x, long x_stride, long n, long d, int w_type, const void *w,
                       const void *b, float eps, void *out, int threads) {
    struct layer_norm_args args = {x_type, w_type, x, w, b, x_stride, d, eps, out};
    over_rows(layer_norm_rows, &args, n, n * d, threads);
}

/* out [n, H, D] (x's type, contiguous) = x rotated by each token's position: halves of each head
 * (the Hugging Face layout), [x1 cos - x2 sin, x2 cos + x1 sin]. x [n, H, D] has its tokens
 * token_stride and its heads head_stride elements apart (a view into a fused q/k/v output);
 * table [rows, 2, D / 2] f32 holds cos and sin for every position; a position past it takes the
 * last row (padding tokens: any value). */
struct rope_args {
    int type;
    const void *x;
    long H, D, token_stride, head_stride, rows;
    const int32_t *positions;
    const float *table;
    void *out;
};

static AVX2 void rope_rows(const void *args, long i0, long i1) {
    const struct rope_args *a = args;
    int type = a->type;
    const void *x = a->x;
    long H = a->H, D = a->D, token_stride = a->token_stride, head_stride = a->head_stride, rows = a->rows, half = D / 2;
    const int32_t *positions = a->positions;
    const float *table = a->table;
    void *out = a->out;
    for (long i = i0; i < i1; i++) {
        long pos = positions[i] < 0 ? 0 : positions[i] >= rows ? rows - 1 : positions[i];
        const float *cos = table + pos * D, *sin = cos + half;
        for (long h = 0; h < H; h++) {
            long in = i * token_stride + h * head_stride, o = (i * H + h) * D;
            long j = 0;
            for (; j + 8 <= half; j += 8) {
                __m256 x1 = load8(x, type, in + j), x2 = load8(x, type, in + half + j);
                __m256 c = _mm256_loadu_ps(cos + j), s = _mm256_loadu_ps(sin + j);
                store8(out, type, o + j, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
                store8(out, type, o + half + j, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
            }
            for (; j < half; j++) {
                float x1 = load1(x, type, in + j), x2 = load1(x, type, in + half + j);
                store1(out, type, o + j, x1 * cos[j] - x2 * sin[j]);
                store1(out, type, o + half + j, x2 * cos[j] + x1 * sin[j]);
            }
        }
    }
}

void linnet_rope(int type, const void *x, long n, long H, long D, long token_stride, long head_stride,
                 const int32_t *positions, const float *table, long rows, void *out, int threads) {
    struct rope_args args = {type, x, H, D, token_stride, head_stride, rows, positions, table, out};
    over_rows(rope_rows, &args, n, n * H * D, threads);
}

/* state[offset + a[i] * a_stride + b[i] * b_stride ..+ block] = value[i] for each of n entries: a
 * and b (i32; b may be NULL: one index) run along consecutive axes of a contiguous state, of
 * a_limit and b_limit positions. An entry with an index outside [0, limit) writes nothing (JAX's
 * scatter: padding tokens at position MaxSeq leave the cache alone). value [n, block] of
 * value_type, its rows value_stride elements apart (a view's: the v columns of a fused matmul's
 * output), rounded to state_type. */
struct put_args {
    int state_type, value_type;
    void *state;
    const int32_t *a, *b;
    long offset, a_stride, a_limit, b_stride, b_limit, value_stride, block;
    const void *value;
};

static AVX2 void put_rows(const void *args, long i0, long i1) {
    const struct put_args *p = args;
    int state_type = p->state_type, value_type = p->value_type;
    const int32_t *a = p->a, *b = p->b;
    long offset = p->offset, a_stride = p->a_stride, a_limit = p->a_limit, b_stride = p->b_stride,
         b_limit = p->b_limit, value_stride = p->value_stride, block = p->block, elem = type_bytes(state_type);
    void *state = p->state;
    const void *value = p->value;
    for (long i = i0; i < i1; i++) {
        long ai = a[i], bi = b ? b[i] : 0;
        if (ai < 0 || ai >= a_limit || bi < 0 || (b && bi >= b_limit))
            continue;
        char *at = (char *)state + (offset + ai * a_stride + bi * b_stride) * elem;
        if (value_type == state_type) {
            memcpy(at, (const char *)value + i * value_stride * elem, block * elem);
            continue;
        }
        long j = 0;
        for (; j + 8 <= block; j += 8)
            store8(at, state_type, j, load8(value, value_type, i * value_stride + j));
        for (; j < block; j++)
            store1(at, state_type, j, load1(value, value_type, i * value_stride + j));
    }
}

void linnet_put_rows(int state_type, void *state, long offset, const int32_t *a, long a_stride, long a_limit,
                     const int32_t *b, long b_stride, long b_limit, long n, int value_type, const void *value,
                     long value_stride, long block, int threads) {
    struct put_args args = {state_type, value_type, state, a, b, offset, a_stride, a_limit, b_stride, b_limit,
                            value_stride, block, value};
    over_rows(put_rows, &args, n, n * block, threads);
}

/* `value` of eight, NaN where x is -inf: what torch's SiLU and GELU give there (-inf * 0, or -inf / inf),
 * where the forms below, their exponential capped, give -inf. */
static inline AVX2 __m256 nan_at_minus_inf(__m256 x, __m256 value) {
    __m256 minus_inf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    return _mm256_blendv_ps(value, _mm256_set1_ps(NAN), minus_inf);
}

/* SiLU of eight: x / (1 + e^-x), e^-x taken at most at 88 (beyond, x / e^88: tiny for the values a model
 * holds, -1e4's 6e-35, where torch's x sigmoid(x) is 0 or near it). */
static inline AVX2 __m256 silu8(__m256 x) {
    __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(88.0f)));
    return nan_at_minus_inf(x, _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
}

/* GELU's tanh form of eight, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), written as the
 * same value x / (1 + e^-2u) (0.5 (1 + tanh u) is sigmoid(2u)): no 1 + tanh cancelling to nothing
 * for large negative x, and silu8's exponential. At x = -inf that would be -inf where the formula,
 * and torch's F.gelu, give -inf * 0: NaN (the limit is 0, but torch's value is what a step computes). */
static inline AVX2 __m256 gelu_tanh8(__m256 x) {
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                             _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), _mm256_mul_ps(x, x), x));
    __m256 e = exp8(_mm256_min_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u), _mm256_set1_ps(88.0f)));
    return nan_at_minus_inf(x, _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
}

static inline AVX2 __m256 apply8(int op, int type, __m256 a, __m256 b) {
    switch (op) {
    case OP_ADD: return _mm256_add_ps(a, b);
    case OP_MUL: return _mm256_mul_ps(a, b);
    case OP_DIV: return _mm256_div_ps(a, b);
    case OP_SILU: return silu8(a);
    case OP_TANH: return tanh8(a);
    case OP_GELU_TANH: return gelu_tanh8(a);
    case OP_SILU_MUL: return _mm256_mul_ps(round8(type, silu8(a)), b); /* silu(a) rounded to a's type, as torch's two ops */
    default: return a;
    }
}

/* out[r, c] = a[r, c] op b[r, c] (b unused by SILU, GELU_TANH, TANH and COPY; SILU_MUL: silu(a) * b, a gated
 * MLP's halves) over rows x cols, each operand's rows
 * its own stride apart (a view's: the gate columns of a fused gate / up output): a of `type`, b of
 * b_type (a Python number's f32 row, stride 0, beside a 16-bit a: torch computes a * number in f32
 * without rounding the number to a's type), computed in f32 and rounded to out_type, as torch
 * computes a 16-bit type's elementwise ops. */
struct elementwise_args {
    int op, type, b_type, out_type;
    const void *a, *b;
    void *out;
    long a_stride, b_stride, out_stride, cols;
};

static AVX2 void elementwise_rows(const void *args, long r0, long r1) {
    const struct elementwise_args *e = args;
    int op = e->op, type = e->type, b_type = e->b_type, out_type = e->out_type;
    int two = op == OP_ADD || op == OP_MUL || op == OP_DIV || op == OP_SILU_MUL;
    const void *a = e->a, *b = e->b;
    void *out = e->out;
    long a_stride = e->a_stride, b_stride = e->b_stride, out_stride = e->out_stride, cols = e->cols;
    for (long r = r0; r < r1; r++) {
        long ia = r * a_stride, ib = r * b_stride, io = r * out_stride, c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256 bv = two ? load8(b, b_type, ib + c) : _mm256_setzero_ps();
            store8(out, out_type, io + c, apply8(op, type, load8(a, type, ia + c), bv));
        }
        if (c == cols)
            continue;
        float av[8] = {0}, bv[8] = {0}, ov[8];
        for (long j = c; j < cols; j++) {
            av[j - c] = load1(a, type, ia + j);
            if (two)
                bv[j - c] = load1(b, b_type, ib + j);
        }
        _mm256_storeu_ps(ov, apply8(op, type, _mm256_loadu_ps(av), _mm256_loadu_ps(bv)));
        for (long j = c; j < cols; j++)
            store1(out, out_type, io + j, ov[j - c]);
    }
}

void linnet_elementwise(int op, int type, const void *a, long a_stride, int b_type, const void *b, long b_stride,
                        int out_type, void *out, long out_stride, long rows, long cols, int threads) {
    struct elementwise_args args = {op, type, b_type, out_type, a, b, out, a_stride, b_stride, out_stride, cols};
    over_rows(elementwise_rows, &args, rows, rows * cols, threads);
}

/* out[i] = table[ids[i]] for n ids, rows of `width` values, converted from `type` to out_type; an id
 * outside [0, rows) gives a row of zeros. */
struct gather_args {
    int type, out_type;
    const void *table;
    long rows, width;
    const int32_t *ids;
    void *out;
};

static AVX2 void gather_rows(const void *args, long i0, long i1) {
    const struct gather_args *g = args;
    int type = g->type, out_type = g->out_type;
    const void *table = g->table;
    long rows = g->rows, width = g->width;
    const int32_t *ids = g->ids;
    void *out = g->out;
    for (long i = i0; i < i1; i++) {
        long id = ids[i], o = i * width;
        if (id < 0 || id >= rows) {
            memset((char *)out + o * type_bytes(out_type), 0, width * type_bytes(out_type));
            continue;
        }
        if (type == out_type) {
            memcpy((char *)out + o * type_bytes(type), (const char *)table + id * width * type_bytes(type),
                   width * type_bytes(type));
            continue;
        }
        for (long j = 0; j < width; j++)
            store1(out, out_type, o + j, load1(table, type, id * width + j));
    }
}

void linnet_gather_rows(int type, const void *table, long rows, long width, const int32_t *ids, long n, int out_type,
                        void *out, int threads) {
    struct gather_args args = {type, out_type, table, rows, width, ids, out};
    over_rows(gather_rows, &args, n, n * width, threads);
}
