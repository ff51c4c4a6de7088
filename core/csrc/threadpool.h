/* A tiny persistent worker pool for the C kernels (threadpool.c).
 *
 * Why not OpenMP: torch ships its own OpenMP runtime, and a second one in the same
 * process keeps its own threads spinning after every parallel region, stealing the
 * cores torch's ops run on. This pool's workers spin briefly, then sleep. */
#ifndef DRAFTWISE_THREADPOOL_H
#define DRAFTWISE_THREADPOOL_H

#include <stdint.h>

typedef void (*dw_range_fn)(void *ctx, int64_t begin, int64_t end);

/* Split [0, n) into ``threads`` contiguous ranges and run fn on each, the calling thread
 * taking the first; returns when all are done. threads <= 1 (or n < 2) runs inline. */
void dw_parallel_for(int threads, int64_t n, dw_range_fn fn, void *ctx);

#endif
