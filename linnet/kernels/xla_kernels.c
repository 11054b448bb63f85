/* Linnet's CPU kernels as XLA FFI handlers, for JAX's CPU backend (jax.ffi.ffi_call), built with
 * cpu_linear.c and cpu_attention.c against the C header jaxlib ships (jax.ffi.include_dir()).
 *
 * The work runs on XLA's own thread pool, not OpenMP's: the calling thread and helpers it
 * schedules claim chunks of the work until none is left (pool.c's jobs). An OpenMP team started
 * from XLA's threads spun against them and ran one row of linears at half the speed of XLA's own
 * dot.
 */
#include <stdlib.h>

#include "kernels.h"
#include "xla/ffi/api/c_api.h"

static void helper(void *job) {
    linnet_job_help(job);
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

/* work(task, c, chunks) for each c < chunks on this thread and XLA's pool (`frame`); returns once
 * every chunk is done: -1 if out of memory, -2 if any chunk failed. A linnet_runner. */
static int run_on_pool(void *frame, linnet_work work, void *task, long chunks) {
    struct linnet_job *job = linnet_job_new(work, task, chunks);
    if (!job)
        return -1;
    long threads = pool_threads(frame);
    for (long i = 1; i < threads && i < chunks; i++) {
        linnet_job_share(job);
        XLA_FFI_ThreadPool_Schedule_Args args = {XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE, NULL,
                                                 ((XLA_FFI_CallFrame *)frame)->ctx, helper, job};
        XLA_FFI_Error *error = ((XLA_FFI_CallFrame *)frame)->api->XLA_FFI_ThreadPool_Schedule(&args);
        if (error) { /* no pool: this thread does it all */
            forget(frame, error);
            linnet_job_help(job); /* this thread takes the share, dropping the reference taken for it */
            break;
        }
    }
    return linnet_job_finish(job);
}

/* work's chunks one after another on this thread: the same chunks run_on_pool would share out. */
static int run_alone(void *frame, linnet_work work, void *task, long chunks) {
    (void)frame;
    int failed = 0;
    for (long c = 0; c < chunks; c++)
        failed |= work(task, c, chunks) != 0;
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
    int status = -1;
    if (panels && cols && widths) {
        for (long p = 0; p < P; p++) {
            panels[p] = base + p * K * 16 * elem;
            cols[p] = p * 16;
            widths[p] = N - p * 16 < 16 ? (int)(N - p * 16) : 16;
        }
        status = linnet_linear_run(run_on_pool, frame, pool_threads(frame), type, x_type, x->data, M, K, P,
                                   (const void *const *)panels, cols, widths, F32, y->data, N);
    }
    free(panels), free(cols), free(widths);
    return status ? fail(frame, "linnet_linear: out of memory") : NULL;
}

/* Up to this many tokens (decode steps, few rows), an attention call asks for the next layer's
 * keys and values of the same rows once it is done: they arrive during the layer's other work. */
#define PREFETCH_NEXT_LAYER 16

/* ---- attention of one query a cache row: q [n, H, D] f32, the stacked caches [L, B, S, KVH, D]
 * (f32, or a 16-bit float's bits as u16), rows [n] i32, positions [n] i32, [layer, window, type]
 * i32 (type: 0 f32, 1 bf16, 2 f16), [scale, softcap] f32 (softcap 0: none), sinks [H] or [0] f32
 * -> out [n, H, D] f32 (cpu_attention.c) */

/* An attention call reading fewer keys' and values' bytes than this runs on the calling thread alone:
 * scheduling a helper on XLA's pool (XLA_FFI_ThreadPool_Schedule) cost the caller 8-12 us a call on a
 * 2-core Zen 4, about what half of 512 KB takes to read, and a one-row decode step's attention reads
 * less (SmolLM2 bf16 at position 200: 150 KB a layer). The chunks and their results are the same. */
#define ATTENTION_ALONE_BYTES (512L << 10)

XLA_FFI_Error *linnet_xla_attention(XLA_FFI_CallFrame *frame) {
    if (metadata(frame) || frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    if (frame->args.size != 8 || frame->rets.size != 1)
        return fail(frame, "linnet_attention takes q, k, v, rows, positions, [layer, window, type], [scale, softcap], "
                           "sinks");
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
        scalars->dtype != XLA_FFI_DataType_S32 || scale->dtype != XLA_FFI_DataType_F32 || scale->rank != 1 ||
        scale->dims[0] != 2 ||
        sinks->dtype != XLA_FFI_DataType_F32 || out->dtype != XLA_FFI_DataType_F32 || k->dims[4] != q->dims[2] ||
        q->dims[2] % 8 || q->dims[1] % k->dims[3] || rows->rank != 1 || rows->dims[0] != q->dims[0] ||
        positions->rank != 1 || positions->dims[0] != q->dims[0] || scalars->rank != 1 || scalars->dims[0] != 3)
        return fail(frame, "linnet_attention: q [n, H, D] f32, caches [L, B, S, KVH, D] f32 / u16, rows / positions "
                           "[n] i32, [layer, window, type] i32, [scale, softcap] f32, sinks [H] or [0] f32");
    if (lw[0] < 0 || lw[0] >= k->dims[0] || k->dims[1] != v->dims[1] || k->dims[2] != v->dims[2] ||
        k->dims[3] != v->dims[3] || k->dims[0] != v->dims[0])
        return fail(frame, "linnet_attention: the layer is outside the stacked caches, or k and v differ in shape");
    long n = q->dims[0], H = q->dims[1], D = q->dims[2], B = k->dims[1], S = k->dims[2], KVH = k->dims[3];
    long layer = (long)B * S * KVH * D * lw[0] * type_bytes(type);
    int with_sinks = sinks->rank == 1 && sinks->dims[0] == H;
    const char *k_layer = (const char *)k->data + layer, *v_layer = (const char *)v->data + layer;
    long keys = 0; /* the positions the tokens read, in all */
    for (long i = 0; i < n; i++) {
        long p = ((const int32_t *)positions->data)[i];
        if (p >= 0 && p < S)
            keys += lw[1] > 0 && lw[1] < p + 1 ? lw[1] : p + 1;
    }
    linnet_runner runner = keys * KVH * D * 2 * type_bytes(type) < ATTENTION_ALONE_BYTES ? run_alone : run_on_pool;
    int status = linnet_attention_run(runner, frame, pool_threads(frame), type, F32, q->data, n, H, KVH, D,
                                      k_layer, v_layer, S * KVH * D, KVH * D, B, S, rows->data, positions->data, lw[1],
                                      with_sinks ? sinks->data : NULL, ((const float *)scale->data)[0],
                                      ((const float *)scale->data)[1], out->data);
    if (n <= PREFETCH_NEXT_LAYER && lw[0] + 1 < k->dims[0]) { /* the same rows' keys and values in the next layer */
        long next = (long)B * S * KVH * D * type_bytes(type);
        linnet_attention_prefetch(type, KVH, D, k_layer + next, v_layer + next, S * KVH * D, KVH * D, B, S, rows->data,
                                  positions->data, lw[1], n);
    }
    return status ? fail(frame, "linnet_attention: out of memory") : NULL;
}
