/* The worker pool behind dw_parallel_for (see threadpool.h).
 *
 * One job at a time (``busy``; a concurrent caller runs its job inline). The caller
 * publishes the job, bumps a generation
 * counter and wakes sleepers; each worker runs its range and decrements ``pending``; the
 * caller runs range 0 and spins until ``pending`` is 0. Workers spin ~100 us for the next
 * job (a decoder layer calls a GEMM every few tens of us), then sleep on a condition
 * variable, so an idle engine costs no CPU. A forked child starts a fresh pool. */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 63
#define SPIN_NS 100000

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;
    atomic_int pending;
    int workers; /* started so far */
    pid_t pid;   /* the process that started them */
    /* the current job */
    dw_range_fn fn;
    void *ctx;
    int64_t n;
    int parts;
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

static void run_part(int part) {
    const int64_t begin = pool.n * part / pool.parts, end = pool.n * (part + 1) / pool.parts;
    if (begin < end) pool.fn(pool.ctx, begin, end);
}

static unsigned start_generation[MAX_WORKERS + 1];

static void *worker(void *arg) {
    const int part = (int)(intptr_t)arg; /* 1..MAX_WORKERS */
    /* the generation before the job that started this worker, so it cannot miss that job */
    unsigned seen = start_generation[part];
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
        if (part < pool.parts) run_part(part);
        /* every worker acknowledges, runner or not: none may still be reading this job's
         * fields when the caller writes the next one */
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
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

static void parallel_for_locked(int threads, int64_t n, dw_range_fn fn, void *ctx) {
    if (threads > n) threads = (int)n;
    if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
    if (threads > 1 && ensure_workers(threads - 1) < threads - 1) threads = 1 + pool.workers;
    if (threads <= 1) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
    pool.fn = fn, pool.ctx = ctx, pool.n = n, pool.parts = threads;
    atomic_store_explicit(&pool.pending, pool.workers, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_part(0);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) cpu_relax();
}

/* Held while a job runs: a second caller (another Python thread, GIL released) runs its
 * job inline instead of sharing the pool, which changes who computes, never what. */
static atomic_flag busy = ATOMIC_FLAG_INIT;

void dw_parallel_for(int threads, int64_t n, dw_range_fn fn, void *ctx) {
    if (threads > 1 && !atomic_flag_test_and_set_explicit(&busy, memory_order_acquire)) {
        parallel_for_locked(threads, n, fn, ctx);
        atomic_flag_clear_explicit(&busy, memory_order_release);
    } else if (n > 0) {
        fn(ctx, 0, n);
    }
}
