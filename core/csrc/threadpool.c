/* The worker pool behind dw_parallel_for (see threadpool.h).
 *
 * One job at a time (``busy``; a concurrent caller runs its job inline). A job is [0, n)
 * cut into chunks of ``grain``; the caller and the workers CLAIM chunks from one atomic
 * cursor until none is left, and the caller returns when every item is done. So a
 * worker that is late (its core busy with another program) costs nothing: whoever is
 * running takes its chunks. Which thread computes a chunk changes from run to run, never
 * what a chunk computes.
 *
 * The cursor holds the job's generation in its high 32 bits and the next index in the
 * low 32, so a claim is a compare-and-swap that also proves the job is still the current
 * one: a worker waking up late can never run a chunk of a job it did not read. Jobs
 * alternate between two slots, and the caller writes the next slot only after the
 * current job is complete, so the fields a claiming worker reads are never being
 * overwritten. Workers spin ~100 us for the next job (a decoder layer calls a GEMM every
 * few tens of us), then sleep on a condition variable, so an idle engine costs no CPU.
 * A forked child starts a fresh pool. */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS (DW_MAX_THREADS - 1)
#define SPIN_NS 100000

typedef struct {
    dw_range_fn fn;
    void *ctx;
    int64_t n, grain;
    int parts; /* threads allowed to work on it: the caller and workers 1..parts-1 */
} job;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;
    atomic_uint_fast64_t cursor; /* generation << 32 | next index */
    atomic_int_fast64_t done;    /* items finished in the current job */
    job jobs[2];                 /* the current job is jobs[generation & 1] */
    int workers;                 /* started so far */
    pid_t pid;                   /* the process that started them */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of job ``gen`` until none is left (or the job is no longer current). */
static void work_on(unsigned gen) {
    const job *j = &pool.jobs[gen & 1];
    const uint64_t tag = (uint64_t)gen << 32;
    for (;;) {
        uint_fast64_t cur = atomic_load_explicit(&pool.cursor, memory_order_acquire);
        if ((cur & 0xffffffff00000000ull) != tag) return;
        const int64_t begin = (int64_t)(cur & 0xffffffffu);
        if (begin >= j->n) return;
        const int64_t end = begin + j->grain < j->n ? begin + j->grain : j->n;
        if (!atomic_compare_exchange_weak_explicit(&pool.cursor, &cur, tag | (uint64_t)end,
                                                   memory_order_acq_rel, memory_order_relaxed))
            continue;
        j->fn(j->ctx, begin, end);
        atomic_fetch_add_explicit(&pool.done, end - begin, memory_order_release);
    }
}

static unsigned start_generation[MAX_WORKERS + 1];

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg; /* 1..MAX_WORKERS */
    /* the generation before the job that started this worker, so it cannot miss that job */
    unsigned seen = start_generation[id];
    for (;;) {
        unsigned gen;
        const int64_t start = now_ns();
        int spins = 0;
        while ((gen = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - start > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                while ((gen = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
                    pthread_cond_wait(&pool.wake, &pool.lock);
                pthread_mutex_unlock(&pool.lock);
                break;
            }
        }
        seen = gen;
        if (id < pool.jobs[gen & 1].parts) work_on(gen);
    }
    return NULL;
}

/* Start workers up to ``count``; returns how many exist (fewer if creation failed). */
static int ensure_workers(int count) {
    if (pool.pid != getpid()) { /* first use, or a forked child: its threads are gone */
        pool.workers = 0;
        pool.pid = getpid();
        pthread_mutex_init(&pool.lock, NULL); /* a fork may have copied them mid-use */
        pthread_cond_init(&pool.wake, NULL);
    }
    while (pool.workers < count) {
        pthread_t t;
        pthread_attr_t attr;
        start_generation[pool.workers + 1] = atomic_load(&pool.generation);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool.workers++;
    }
    return pool.workers;
}

static void parallel_for_locked(int threads, int64_t n, int64_t grain, dw_range_fn fn, void *ctx) {
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads > 1 && ensure_workers(threads - 1) < threads - 1) threads = 1 + pool.workers;
    if (threads <= 1 || n <= grain) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    const unsigned gen = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
    /* the previous job is complete, so no worker reads this slot (it held job gen - 2) */
    pool.jobs[gen & 1] = (job){fn, ctx, n, grain, threads};
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.cursor, (uint64_t)gen << 32, memory_order_release);
    pthread_mutex_lock(&pool.lock);
    atomic_store_explicit(&pool.generation, gen, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    work_on(gen);
    while (atomic_load_explicit(&pool.done, memory_order_acquire) < n) cpu_relax();
}

/* Held while a job runs: a second caller (another Python thread, GIL released) runs its
 * job inline instead of sharing the pool, which changes who computes, never what. */
static atomic_flag busy = ATOMIC_FLAG_INIT;

void dw_parallel_for_grain(int threads, int64_t n, int64_t grain, dw_range_fn fn, void *ctx) {
    if (grain < 1) grain = 1;
    if (n >= 0xffffffffll) grain = n; /* the cursor holds 32-bit indices: run inline */
    if (threads > 1 && !atomic_flag_test_and_set_explicit(&busy, memory_order_acquire)) {
        parallel_for_locked(threads, n, grain, fn, ctx);
        atomic_flag_clear_explicit(&busy, memory_order_release);
    } else if (n > 0) {
        fn(ctx, 0, n);
    }
}

void dw_parallel_for(int threads, int64_t n, dw_range_fn fn, void *ctx) {
    const int64_t parts = threads > 1 ? threads : 1;
    dw_parallel_for_grain(threads, n, (n + parts - 1) / parts, fn, ctx);
}
