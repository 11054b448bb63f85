/* Linnet's own worker threads for the kernels torch's path calls (the XLA handlers use XLA's pool).
 *
 * Why not OpenMP: a parallel region ends at a barrier that waits for every thread of the team.
 * On a machine busy with other work, a worker the OS has not scheduled holds the region until it
 * runs: a SmolLM2 decode step (about 150 regions) took 0.35-2.5 s on 2 threads against 55-67 ms on
 * one, with other processes on the cores. Here the calling thread and the helpers claim chunks of
 * the work until none is left, and the caller waits only for chunks a helper has begun: a helper
 * that wakes late finds its share done (JAX's path, on XLA's pool, kept its speed under that load).
 *
 * Each helper has a mailbox holding the job it is to join. It spins on it for a while after its
 * last job, as OpenMP's workers do (a step's regions come microseconds apart), then sleeps on a
 * futex. A job is shared by reference count: whoever takes it from a mailbox owns one reference.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"

#define MAX_HELPERS 255
/* Pause instructions a helper spins through before it sleeps: a few ms on current x86 cores
 * (a pause is 40-140 cycles), longer than the Python between a step's kernels. */
#define SPINS 40000

struct linnet_job {
    linnet_work work;
    void *task; /* the caller's: read only while chunks remain */
    long chunks;
    atomic_long next, done;
    atomic_int refs, failed;
};

struct linnet_job *linnet_job_new(linnet_work work, void *task, long chunks) {
    struct linnet_job *job = malloc(sizeof *job);
    if (!job)
        return NULL;
    job->work = work, job->task = task, job->chunks = chunks;
    atomic_init(&job->next, 0), atomic_init(&job->done, 0), atomic_init(&job->failed, 0), atomic_init(&job->refs, 1);
    return job;
}

void linnet_job_share(struct linnet_job *job) {
    atomic_fetch_add(&job->refs, 1);
}

static void claim(struct linnet_job *job) {
    for (long c; (c = atomic_fetch_add(&job->next, 1)) < job->chunks;) {
        if (job->work(job->task, c, job->chunks))
            atomic_store(&job->failed, 1);
        atomic_fetch_add(&job->done, 1);
    }
}

static void release(struct linnet_job *job) {
    if (atomic_fetch_sub(&job->refs, 1) == 1)
        free(job);
}

void linnet_job_help(struct linnet_job *job) {
    claim(job);
    release(job);
}

int linnet_job_finish(struct linnet_job *job) {
    claim(job);
    for (long spins = 0; atomic_load(&job->done) < job->chunks; spins++) /* only chunks a helper began */
        if (spins < 1000)
            _mm_pause();
        else
            sched_yield();
    int failed = atomic_load(&job->failed);
    release(job);
    return failed ? -2 : 0;
}

struct helper {
    _Atomic(struct linnet_job *) mailbox;
    atomic_int asleep; /* the futex word: 1 while the helper sleeps or is about to */
    char pad[64 - sizeof(void *) - sizeof(int)];
};

static struct helper helpers[MAX_HELPERS];
static atomic_int started; /* helpers running */
static pthread_mutex_t starting = PTHREAD_MUTEX_INITIALIZER;

static long futex(atomic_int *word, int op, int value) {
    return syscall(SYS_futex, (int *)word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static void *helper_main(void *data) {
    struct helper *h = data;
    for (;;) {
        struct linnet_job *job;
        long spins = 0;
        while (!(job = atomic_exchange(&h->mailbox, NULL))) {
            if (++spins < SPINS) {
                _mm_pause();
                continue;
            }
            /* asleep before the last look: a caller that posts after this look sees it and wakes us */
            atomic_store(&h->asleep, 1);
            if ((job = atomic_exchange(&h->mailbox, NULL))) {
                atomic_store(&h->asleep, 0);
                break;
            }
            futex(&h->asleep, FUTEX_WAIT, 1);
            atomic_store(&h->asleep, 0);
            spins = 0;
        }
        linnet_job_help(job);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: it starts its own when it needs them. (Its
 * mailboxes may hold jobs of the parent's: dropped unrun, as their chunks were all claimed.) */
static void forget_helpers(void) {
    atomic_store(&started, 0);
    for (int i = 0; i < MAX_HELPERS; i++) {
        atomic_store(&helpers[i].mailbox, NULL);
        atomic_store(&helpers[i].asleep, 0);
    }
}

/* Helpers 0 .. want - 1 running; returns how many are. */
static int start_helpers(int want) {
    if (want > MAX_HELPERS)
        want = MAX_HELPERS;
    if (atomic_load(&started) >= want)
        return want;
    pthread_mutex_lock(&starting);
    static int registered;
    if (!registered)
        registered = pthread_atfork(NULL, NULL, forget_helpers) == 0;
    int n = atomic_load(&started);
    /* helpers take no signals: a Ctrl-C goes to the process's own threads (Python's handler), as
     * the threads a helper is made with inherit the mask it is made under */
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    for (; n < want; n++) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, helper_main, &helpers[n]);
        pthread_attr_destroy(&attr);
        if (failed)
            break;
        pthread_setname_np(thread, "linnet-pool"); /* as ps -L and top -H show it */
        atomic_store(&started, n + 1);
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    pthread_mutex_unlock(&starting);
    return n;
}

int linnet_parallel(linnet_work work, void *task, long chunks, int threads) {
    if (chunks <= 0)
        return 0;
    long helpers_wanted = (threads < chunks ? threads : chunks) - 1;
    if (helpers_wanted <= 0)
        return work(task, 0, 1) ? -2 : 0; /* one thread: the work whole, as one chunk */
    struct linnet_job *job = linnet_job_new(work, task, chunks);
    if (!job)
        return -1;
    long n = start_helpers((int)helpers_wanted);
    for (long i = 0; i < n; i++) {
        linnet_job_share(job);
        struct linnet_job *stale = atomic_exchange(&helpers[i].mailbox, job);
        if (stale) /* a job this helper never took up: its reference is ours to drop */
            release(stale);
        if (atomic_exchange(&helpers[i].asleep, 0) == 1)
            futex(&helpers[i].asleep, FUTEX_WAKE, 1);
    }
    return linnet_job_finish(job);
}

int linnet_on_threads(void *threads, linnet_work work, void *task, long chunks) {
    return linnet_parallel(work, task, chunks, *(int *)threads);
}
