/* Linnet's CPU kernels as XLA FFI handlers, for JAX's CPU backend (jax.ffi.ffi_call), built with
 * cpu_linear.c and cpu_attention.c against the C header jaxlib ships (jax.ffi.include_dir()).
 *
 * The work runs on XLA's own thread pool, not OpenMP's: the calling thread and helpers it
 * schedules claim chunks of the work until none is left. An OpenMP team started from XLA's
 * threads spun against them and ran one row of linears at half the speed of XLA's own dot.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"
#include "xla/ffi/api/c_api.h"

/* Chunks a thread, claimed dynamically: a helper that starts late finds its share taken. One each,
 * a contiguous run of panels a thread as OpenMP's static schedule gives torch's kernel: SmolLM2's
 * load ran 4-5% faster so than with four each (JAX bf16 539 -> 560, f32 211 -> 222 tokens/s,
 * medians of four alternating runs on 2 cores). */
#define CHUNKS_A_THREAD 1

/* One call's work in `chunks` pieces. The job is shared by reference count: a helper that starts
 * after the last chunk was claimed finds nothing to do and lets go, touching only the job. */
struct job {
    int (*work)(void *task, long chunk, long chunks);
    void *task; /* the handler's: read only while chunks remain */
    long chunks;
    atomic_long next, done;
    atomic_int refs, failed;
};

static void claim(struct job *job) {
    for (long c; (c = atomic_fetch_add(&job->next, 1)) < job->chunks;) {
        if (job->work(job->task, c, job->chunks))
            atomic_store(&job->failed, 1);
        atomic_fetch_add(&job->done, 1);
    }
}

static void release(struct job *job) {
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        free(job);
}

static void helper(void *data) {
    claim(data);
    release(data);
}

static XLA_FFI_Error *fail(XLA_FFI_CallFrame *frame, const char *message) {
    XLA_FFI_Error_Create_Args args = {XLA_FFI_Error_Create_Args_STRUCT_SIZE, NULL, message,
                                      XLA_FFI_Error_Code_INVALID_ARGUMENT};
    return frame->api->XLA_FFI_Error_Create(&args);
}

static void forget(XLA_FFI_CallFrame *frame, XLA_FFI_Error *error) {
    XLA_FFI_Error_Destroy_Args args = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, NULL, error};
    frame->api->XLA_FFI_Error_Destroy(&args);
}

static long pool_threads(XLA_FFI_CallFrame *frame) {
    int64_t n = 1;
    XLA_FFI_ThreadPool_NumThreads_Args args = {XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE, NULL, frame->ctx, &n};
    XLA_FFI_Error *error = frame->api->XLA_FFI_ThreadPool_NumThreads(&args);
    if (error) {
        forget(frame, error);
        return 1;
    }
    return n > 0 ? n : 1;
}

/* work(task, c, chunks) for c < chunks (at most `limit` chunks) on this thread and XLA's pool;
 * returns once every chunk is done: -1 if out of memory, -2 if any chunk failed. */
static int run_on_pool(XLA_FFI_CallFrame *frame, int (*work)(void *, long, long), void *task, long limit) {
    long threads = pool_threads(frame), chunks = threads * CHUNKS_A_THREAD;
    struct job *job = malloc(sizeof *job);
    if (!job)
        return -1;
    job->work = work, job->task = task, job->chunks = chunks < limit ? chunks : limit;
    atomic_init(&job->next, 0), atomic_init(&job->done, 0), atomic_init(&job->refs, 1), atomic_init(&job->failed, 0);
    for (long i = 1; i < threads && i < job->chunks; i++) {
        atomic_fetch_add(&job->refs, 1);
        XLA_FFI_ThreadPool_Schedule_Args args = {XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE, NULL, frame->ctx,
                                                 helper, job};
        XLA_FFI_Error *error = frame->api->XLA_FFI_ThreadPool_Schedule(&args);
        if (error) { /* no pool: this thread does it all */
            forget(frame, error);
            atomic_fetch_sub(&job->refs, 1);
            break;
        }
    }
    claim(job);
    while (atomic_load(&job->done) < job->chunks) /* only chunks a helper has claimed are left */
        sched_yield();
    int failed = atomic_load(&job->failed);
    release(job);
    return failed ? -2 : 0;
}

/* Answers XLA's question of which API a handler speaks; true if that was the call. */
static int metadata(XLA_FFI_CallFrame *frame) {
    XLA_FFI_Extension_Base *ext = frame->extension_start;
    if (!ext || ext->type != XLA_FFI_Extension_Metadata)
        return 0;
    XLA_FFI_Metadata *meta = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
    meta->api_version.major_version = XLA_FFI_API_MAJOR;
    meta->api_version.minor_version = XLA_FFI_API_MINOR;
    meta->traits = 0;
    return 1;
}

static int type_of(XLA_FFI_DataType dtype) {
    return dtype == XLA_FFI_DataType_F32    ? F32
           : dtype == XLA_FFI_DataType_BF16 ? BF16
           : dtype == XLA_FFI_DataType_F16  ? F16
                                            : -1;
}

/* ---- linear: x [M, K] f32 (bf16 for panels in pairs), w [P, K, 16] panels (cpu_linear.c's layout, the last one zero-padded)
 * or [L, P, K, 16] with the layer [] i32 to use -> y [M, N] f32 */

struct linear_task {
    int type;
    const void *x;
    long M, K, N, P;
    const void **panels;
    const long *cols;
    const int *widths;
    float *y;
};

static int linear_chunk(void *data, long c, long chunks) {
    struct linear_task *t = data;
    return linnet_linear_panels(t->type, t->x, t->M, t->K, t->panels, t->cols, t->widths, t->y, t->N,
                                t->P * c / chunks, t->P * (c + 1) / chunks);
}

XLA_FFI_Error *linnet_xla_linear(XLA_FFI_CallFrame *frame) {
    if (metadata(frame) || frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    if (frame->args.size != 3 || frame->rets.size != 1)
        return fail(frame, "linnet_linear takes x, w and a layer and returns y");
    XLA_FFI_Buffer *x = frame->args.args[0], *w = frame->args.args[1], *at = frame->args.args[2],
                   *y = frame->rets.rets[0];
    int type = type_of(w->dtype), stacked = w->rank == 4;
    int64_t *dims = w->dims + stacked; /* [P, K, 16] */
    int x_type = type_of(x->dtype);
    if (type < 0 || (x_type != F32 && x_type != BF16) || y->dtype != XLA_FFI_DataType_F32 || x->rank != 2 ||
        (w->rank != 3 && !stacked) || at->dtype != XLA_FFI_DataType_S32 || y->rank != 2 || dims[2] != 16 ||
        x->dims[1] != dims[1] || y->dims[0] != x->dims[0] || y->dims[1] > 16 * dims[0] ||
        (stacked && (*(int32_t *)at->data < 0 || *(int32_t *)at->data >= w->dims[0])))
        return fail(frame, "linnet_linear: x [M, K] f32 / bf16, w [(L,) P, K, 16] f32 / bf16 / f16, layer i32, "
                           "y [M, N <= 16 P] f32");
    long M = x->dims[0], K = x->dims[1], N = y->dims[1], P = (N + 15) / 16, elem = type_bytes(type);
    if (M == 0 || N == 0)
        return NULL;
    const char *base = (const char *)w->data + (stacked ? *(int32_t *)at->data * dims[0] * K * 16 * elem : 0);
    const void **panels = malloc(P * sizeof(void *));
    long *cols = malloc(P * sizeof(long));
    int *widths = malloc(P * sizeof(int));
    void *scratch = NULL;
    const void *input = panels && cols && widths ? linnet_linear_input(type, x_type, x->data, M, K, &scratch) : NULL;
    int status = -1;
    if (input) {
        for (long p = 0; p < P; p++) {
            panels[p] = base + p * K * 16 * elem;
            cols[p] = p * 16;
            widths[p] = N - p * 16 < 16 ? (int)(N - p * 16) : 16;
        }
        struct linear_task task = {type, input, M, K, N, P, panels, cols, widths, y->data};
        status = run_on_pool(frame, linear_chunk, &task, P);
    }
    free(panels), free(cols), free(widths), free(scratch);
    return status ? fail(frame, "linnet_linear: out of memory") : NULL;
}

/* Up to this many tokens (decode steps, few rows), an attention call asks for the next layer's
 * keys and values of the same rows once it is done: they arrive during the layer's other work. */
#define PREFETCH_NEXT_LAYER 16

/* ---- attention of one query a cache row: q [n, H, D] f32, the stacked caches [L, B, S, KVH, D]
 * (f32, or a 16-bit float's bits as u16), rows [n] i32, positions [n] i32, [layer, window, type]
 * i32 (type: 0 f32, 1 bf16, 2 f16), scale [] f32, sinks [H] or [0] f32 -> out [n, H, D] f32
 * (cpu_attention.c) */

struct attention_task {
    int type;
    const float *q;
    long n, H, KVH, D;
    const void *k, *v;
    long row_stride, pos_stride, batch, max_seq;
    const int32_t *rows, *positions;
    long window;
    const float *sinks;
    float scale;
    float *out;
    long parts;    /* each unit's span in this many parts (1: whole units) */
    float *parted; /* the parts' outputs and stats, where parts > 1 */
};

static int attention_chunk(void *data, long c, long chunks) {
    struct attention_task *t = data;
    long units = t->n * t->KVH; /* a token's KV heads can go to different threads: one decode row has work for all */
    return linnet_attention_units(t->type, t->q, t->H, t->KVH, t->D, t->k, t->v, t->row_stride, t->pos_stride,
                                  t->batch, t->max_seq, t->rows, t->positions, t->window, t->sinks, t->scale, t->out,
                                  units * c / chunks, units * (c + 1) / chunks);
}

static int attention_part_chunk(void *data, long c, long chunks) {
    struct attention_task *t = data;
    long items = t->n * t->KVH * t->parts;
    return linnet_attention_parts(t->type, t->q, t->n, t->H, t->KVH, t->D, t->k, t->v, t->row_stride, t->pos_stride,
                                  t->batch, t->max_seq, t->rows, t->positions, t->window, t->scale, t->parts,
                                  t->parted, items * c / chunks, items * (c + 1) / chunks);
}

XLA_FFI_Error *linnet_xla_attention(XLA_FFI_CallFrame *frame) {
    if (metadata(frame) || frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    if (frame->args.size != 8 || frame->rets.size != 1)
        return fail(frame, "linnet_attention takes q, k, v, rows, positions, [layer, window, type], scale, sinks");
    XLA_FFI_Buffer **a = (XLA_FFI_Buffer **)frame->args.args, *out = frame->rets.rets[0];
    XLA_FFI_Buffer *q = a[0], *k = a[1], *v = a[2], *rows = a[3], *positions = a[4], *scalars = a[5], *scale = a[6],
                   *sinks = a[7];
    if (scalars->dtype != XLA_FFI_DataType_S32 || scalars->rank != 1 || scalars->dims[0] != 3)
        return fail(frame, "linnet_attention: [layer, window, type] must be 3 i32");
    const int32_t *lw = scalars->data;
    int type = k->dtype == XLA_FFI_DataType_F32 ? F32 : k->dtype == XLA_FFI_DataType_U16 ? lw[2] : -1;
    if (type < F32 || type > F16 || (type == F32) != (k->dtype == XLA_FFI_DataType_F32) || v->dtype != k->dtype ||
        q->dtype != XLA_FFI_DataType_F32 || q->rank != 3 || k->rank != 5 ||
        v->rank != 5 || rows->dtype != XLA_FFI_DataType_S32 || positions->dtype != XLA_FFI_DataType_S32 ||
        scalars->dtype != XLA_FFI_DataType_S32 || scale->dtype != XLA_FFI_DataType_F32 ||
        sinks->dtype != XLA_FFI_DataType_F32 || out->dtype != XLA_FFI_DataType_F32 || k->dims[4] != q->dims[2] ||
        q->dims[2] % 8 || q->dims[1] % k->dims[3] || rows->rank != 1 || rows->dims[0] != q->dims[0] ||
        positions->rank != 1 || positions->dims[0] != q->dims[0] || scalars->rank != 1 || scalars->dims[0] != 3)
        return fail(frame, "linnet_attention: q [n, H, D] f32, caches [L, B, S, KVH, D] f32 / u16, rows / positions "
                           "[n] i32, [layer, window, type] i32, scale f32, sinks [H] or [0] f32");
    if (lw[0] < 0 || lw[0] >= k->dims[0] || k->dims[1] != v->dims[1] || k->dims[2] != v->dims[2] ||
        k->dims[3] != v->dims[3] || k->dims[0] != v->dims[0])
        return fail(frame, "linnet_attention: the layer is outside the stacked caches, or k and v differ in shape");
    long n = q->dims[0], H = q->dims[1], D = q->dims[2], B = k->dims[1], S = k->dims[2], KVH = k->dims[3];
    long layer = (long)B * S * KVH * D * lw[0] * type_bytes(type);
    int with_sinks = sinks->rank == 1 && sinks->dims[0] == H;
    struct attention_task task = {type, q->data, n, H, KVH, D, (const char *)k->data + layer,
                                  (const char *)v->data + layer, S * KVH * D, KVH * D, B, S, rows->data,
                                  positions->data, lw[1], with_sinks ? sinks->data : NULL,
                                  *(const float *)scale->data, out->data, 1, NULL};
    /* few units (one or two rows decoding over a long prompt): each span in parts, then merged */
    long parts = n ? linnet_attention_span_parts(n, KVH, pool_threads(frame), task.rows, task.positions, B, S,
                                                 task.window) : 1;
    task.parted = parts > 1 ? malloc(linnet_attention_parted_floats(n, H, KVH, D, parts) * sizeof(float)) : NULL;
    task.parts = task.parted ? parts : 1;
    int status = 0;
    if (task.parts > 1) {
        status = run_on_pool(frame, attention_part_chunk, &task, n * KVH * task.parts);
        if (!status)
            linnet_attention_merge(n, H, KVH, D, task.parts, task.parted, B, S, task.rows, task.positions,
                                   task.window, task.sinks, task.out, 0, n * KVH);
        free(task.parted);
    } else if (n) {
        status = run_on_pool(frame, attention_chunk, &task, n * KVH);
    }
    if (n <= PREFETCH_NEXT_LAYER && lw[0] + 1 < k->dims[0]) { /* the same rows' keys and values in the next layer */
        long next = (long)B * S * KVH * D * type_bytes(type);
        linnet_attention_prefetch(type, KVH, D, (const char *)task.k + next, (const char *)task.v + next,
                                  task.row_stride, task.pos_stride, B, S, task.rows, task.positions, task.window, n);
    }
    return status ? fail(frame, "linnet_attention: out of memory") : NULL;
}
