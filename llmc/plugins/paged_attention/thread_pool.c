/* The CPU attention kernel's worker threads: one pool per process, started on first use, whose
 * workers sleep on a condition variable between calls and take items from an atomic counter
 * (dynamic scheduling).
 *
 * Why not OpenMP: the kernel runs between two ONNX Runtime segments, once per layer, and ORT's
 * pool runs next on the same cores. An OpenMP team spin-waits after its region unless
 * OMP_WAIT_POLICY=passive was set before the process loaded libgomp -- and torch, usually
 * imported first, loads the same libgomp. Spinning workers starved ORT (measured on 2 cores: a
 * 16-sequence Gemma 3 270M decode step took ~200 ms instead of ~110 ms). These workers sleep
 * whatever the environment. */
#include "thread_pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef llmc_pa_item_fn item_fn;

static struct {
  pthread_once_t once;
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  int num_workers;
  int64_t generation; /* bumped per parallel call; workers run each generation once */
  int pending;        /* workers not yet finished with the current generation */
  item_fn fn;
  const void *ctx;
  int64_t num_items, next;
} pool = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER};

static void run_items(item_fn fn, const void *ctx, int64_t num_items) {
  for (int64_t i; (i = __atomic_fetch_add(&pool.next, 1, __ATOMIC_RELAXED)) < num_items;)
    fn(ctx, i);
}

static void *worker(void *arg) {
  (void)arg;
  int64_t seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (pool.generation == seen) pthread_cond_wait(&pool.wake, &pool.lock);
    seen = pool.generation;
    item_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    int64_t n = pool.num_items;
    pthread_mutex_unlock(&pool.lock);
    run_items(fn, ctx, n);
    pthread_mutex_lock(&pool.lock);
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  return NULL;
}

/* Threads: LLMC_NUM_THREADS, else OMP_NUM_THREADS, else the online cores; the caller is one. */
static void start_pool(void) {
  const char *env = getenv("LLMC_NUM_THREADS");
  if (env == NULL) env = getenv("OMP_NUM_THREADS");
  long threads = env != NULL ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  for (long i = 1; i < threads; ++i) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) break;
    pthread_detach(thread);
    pool.num_workers++;
  }
}

void llmc_pa_parallel_for(item_fn fn, const void *ctx, int64_t num_items) {
  pthread_once(&pool.once, start_pool);
  if (pool.num_workers == 0 || num_items < 2) {
    for (int64_t i = 0; i < num_items; ++i) fn(ctx, i);
    return;
  }
  pthread_mutex_lock(&pool.lock);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.num_items = num_items;
  pool.next = 0;
  pool.pending = pool.num_workers;
  pool.generation++;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);
  run_items(fn, ctx, num_items);
  pthread_mutex_lock(&pool.lock);
  while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
  pthread_mutex_unlock(&pool.lock);
}
