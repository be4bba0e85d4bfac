/* The CPU attention kernel's own pool of worker threads (thread_pool.c), for calls without an
 * llmc_pa_parallel runner (the ctypes binding, cpu.py). */
#ifndef LLMC_PA_THREAD_POOL_H
#define LLMC_PA_THREAD_POOL_H

#include <stdint.h>

#include "paged_attention.h"

/* fn(ctx, i) for i in [0, num_items), on the caller and the workers; returns when all are done.
 * The pool starts on first use. */
__attribute__((visibility("hidden"))) void llmc_pa_parallel_for(llmc_pa_item_fn fn,
                                                                const void *ctx,
                                                                int64_t num_items);

#endif
