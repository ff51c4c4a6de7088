/* A tiny persistent worker pool for the C kernels (threadpool.c).
 *
 * Why not OpenMP: torch ships its own OpenMP runtime, and a second one in the same
 * process keeps its own threads spinning after every parallel region, stealing the
 * cores torch's ops run on. This pool's workers spin briefly, then sleep. */
#ifndef DRAFTWISE_THREADPOOL_H
#define DRAFTWISE_THREADPOOL_H

#include <stdint.h>

typedef void (*dw_range_fn)(void *ctx, int64_t begin, int64_t end);

/* The most threads a job runs on (the caller and DW_MAX_THREADS - 1 workers). */
#define DW_MAX_THREADS 64

/* The threads an entry point runs a job on, from the count the Python side passed: at
 * least 1 and at most DW_MAX_THREADS (a larger count runs as the most, never as one). The
 * one place this is decided: each kernel computes an item the same way on any thread, so
 * the count moves time only. */
static inline int dw_threads(int64_t requested) {
    return requested < 1 ? 1 : requested > DW_MAX_THREADS ? DW_MAX_THREADS : (int)requested;
}

/* Run fn over [0, n) in chunks of ``grain`` items claimed by up to ``threads`` threads
 * (the caller among them); returns when all are done. threads <= 1, or n <= grain, runs
 * inline. fn must compute an item the same way whichever thread runs it. */
void dw_parallel_for_grain(int threads, int64_t n, int64_t grain, dw_range_fn fn, void *ctx);

/* dw_parallel_for_grain with one chunk per thread (ceil(n / threads) items). */
void dw_parallel_for(int threads, int64_t n, dw_range_fn fn, void *ctx);

#endif
