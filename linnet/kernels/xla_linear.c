/* The CPU linear kernel as an XLA FFI handler, for JAX's CPU backend (jax.ffi.ffi_call).
 *
 * Arguments: x [M, K] f32, w [P, K, 16] panels (f32, bf16 or f16; `cpu_linear.c`'s layout, the
 * last panel zero-padded). Result: y [M, N] f32, N <= 16 P. Built together with cpu_linear.c
 * against the C header jaxlib ships (jax.ffi.include_dir()).
 *
 * The work runs on XLA's own thread pool, not OpenMP's: the calling thread and helpers it
 * schedules claim chunks of panels until none is left. An OpenMP team started from XLA's
 * threads spun against them and ran one row at half the speed of XLA's own dot.
 */
#include <immintrin.h>
#include <sched.h>
#include <stdlib.h>

#include "cpu_linear.h"
#include "xla/ffi/api/c_api.h"

#define CHUNKS_A_THREAD 4  /* claimed dynamically: a busy helper's share goes to the others */

static XLA_FFI_Error *fail(XLA_FFI_CallFrame *frame, const char *message) {
    XLA_FFI_Error_Create_Args args = {XLA_FFI_Error_Create_Args_STRUCT_SIZE, NULL, message,
                                      XLA_FFI_Error_Code_INVALID_ARGUMENT};
    return frame->api->XLA_FFI_Error_Create(&args);
}

static void forget(XLA_FFI_CallFrame *frame, XLA_FFI_Error *error) {
    XLA_FFI_Error_Destroy_Args args = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, NULL, error};
    frame->api->XLA_FFI_Error_Destroy(&args);
}

static void helper(void *data) {
    linnet_chunks(data);
    linnet_release(data);
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

/* Runs the job on this thread and up to threads - 1 helpers; returns once every chunk is done. */
static void run_on_pool(XLA_FFI_CallFrame *frame, struct linnet_job *job, long threads) {
    for (long i = 1; i < threads; i++) {
        atomic_fetch_add(&job->refs, 1);
        XLA_FFI_ThreadPool_Schedule_Args args = {XLA_FFI_ThreadPool_Schedule_Args_STRUCT_SIZE, NULL, frame->ctx,
                                                 helper, job};
        XLA_FFI_Error *error = frame->api->XLA_FFI_ThreadPool_Schedule(&args);
        if (error) {  /* no pool: this thread does it all */
            forget(frame, error);
            atomic_fetch_sub(&job->refs, 1);
            break;
        }
    }
    linnet_chunks(job);
    while (atomic_load(&job->done) < job->chunks)  /* only chunks a helper has claimed are left */
        sched_yield();
}

XLA_FFI_Error *linnet_xla_linear(XLA_FFI_CallFrame *frame) {
    XLA_FFI_Extension_Base *ext = frame->extension_start;
    if (ext && ext->type == XLA_FFI_Extension_Metadata) {  /* XLA asks which API this handler speaks */
        XLA_FFI_Metadata *meta = ((XLA_FFI_Metadata_Extension *)ext)->metadata;
        meta->api_version.major_version = XLA_FFI_API_MAJOR;
        meta->api_version.minor_version = XLA_FFI_API_MINOR;
        meta->traits = 0;
        return NULL;
    }
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    if (frame->args.size != 2 || frame->rets.size != 1)
        return fail(frame, "linnet_linear takes x and w and returns y");
    XLA_FFI_Buffer *x = frame->args.args[0], *w = frame->args.args[1], *y = frame->rets.rets[0];
    int type;
    switch (w->dtype) {
    case XLA_FFI_DataType_F32: type = 0; break;
    case XLA_FFI_DataType_BF16: type = 1; break;
    case XLA_FFI_DataType_F16: type = 2; break;
    default: return fail(frame, "linnet_linear: w must be f32, bf16 or f16 panels");
    }
    if (x->dtype != XLA_FFI_DataType_F32 || y->dtype != XLA_FFI_DataType_F32 || x->rank != 2 || w->rank != 3 ||
        y->rank != 2 || w->dims[2] != 16 || x->dims[1] != w->dims[1] || y->dims[0] != x->dims[0] ||
        y->dims[1] > 16 * w->dims[0])
        return fail(frame, "linnet_linear: x [M, K] f32, w [P, K, 16], y [M, N <= 16 P] f32");
    long M = x->dims[0], K = x->dims[1], N = y->dims[1], P = (N + 15) / 16, elem = type == 0 ? 4 : 2;
    long threads = pool_threads(frame);
    const void **panels = malloc(P * sizeof(void *));
    long *cols = malloc(P * sizeof(long));
    int *widths = malloc(P * sizeof(int));
    struct linnet_job *job = calloc(1, sizeof *job);
    if (!panels || !cols || !widths || !job) {
        free(panels), free(cols), free(widths), free(job);
        return fail(frame, "linnet_linear: out of memory for the panel table");
    }
    for (long p = 0; p < P; p++) {
        panels[p] = (const char *)w->data + p * K * 16 * elem;
        cols[p] = p * 16;
        widths[p] = N - p * 16 < 16 ? (int)(N - p * 16) : 16;
    }
    *job = (struct linnet_job){.type = type, .x = x->data, .M = M, .K = K, .P = P, .N = N, .panels = panels,
                               .cols = cols, .widths = widths, .y = y->data,
                               .chunks = threads > 1 ? threads * CHUNKS_A_THREAD : 1};
    atomic_init(&job->next, 0), atomic_init(&job->done, 0), atomic_init(&job->refs, 1), atomic_init(&job->failed, 0);
    run_on_pool(frame, job, threads);
    int failed = atomic_load(&job->failed);
    linnet_release(job);
    free(panels), free(cols), free(widths);
    return failed ? fail(frame, "linnet_linear: out of memory for a widened panel") : NULL;
}
