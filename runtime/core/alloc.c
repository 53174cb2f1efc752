/* runtime/core/alloc.c: the CPU allocator. Counts live and peak bytes so the Lua front end
 * can tell its collector how much C memory its handles hold (DESIGN.md).
 *
 * Note [block cache]: a training step allocates the same large sizes every iteration
 * (activations, gradients, im2col buffers). Served by glibc, each large block is a fresh
 * mmap whose pages fault in on first touch, which once made an out-of-place add on 16 MiB
 * four times slower than the same add in place. Freed blocks above CACHE_MIN are therefore
 * kept in a small cache and handed out again to a request of the same rounded size; the
 * cache holds at most DDPLUA_CPU_CACHE_MB (default 1024) MiB and is emptied, and the
 * allocation retried, when the system refuses memory. ddp_memory_empty_cache() returns it
 * all. Small blocks come from plain malloc (glibc's per-thread cache is fast; memalign on
 * small blocks made glibc consolidate its fast bins on every call). */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/core.h"

static int64_t live_bytes, peak_bytes;

enum { SMALL_BLOCK = 1024 };                 /* up to this: malloc, 16-byte aligned */
enum { CACHE_MIN = 64 * 1024 };              /* from this size up: cached when freed */
enum { CACHE_SLOTS = 64, PAGE = 4096 };

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t size; } cache[CACHE_SLOTS];
static int cache_count;
static size_t cache_bytes, cache_cap;
static int cache_ready;

static void cache_child_after_fork(void) { pthread_mutex_init(&cache_lock, NULL); }

/* Under cache_lock. */
static void cache_init(void) {
  if (cache_ready) return;
  const char *env = getenv("DDPLUA_CPU_CACHE_MB");
  long mb = env && *env ? atol(env) : 1024;
  cache_cap = mb > 0 ? (size_t)mb << 20 : 0;
  pthread_atfork(NULL, NULL, cache_child_after_fork);
  cache_ready = 1;
}

/* The size a large request really takes: whole pages, so near sizes share blocks. */
static size_t large_size(size_t nbytes) { return (nbytes + PAGE - 1) / PAGE * PAGE; }

static void *cache_take(size_t size) {
  void *p = NULL;
  pthread_mutex_lock(&cache_lock);
  cache_init();
  for (int i = cache_count - 1; i >= 0; i--) {
    if (cache[i].size != size) continue;
    p = cache[i].p;
    cache_bytes -= size;
    cache[i] = cache[--cache_count];
    break;
  }
  pthread_mutex_unlock(&cache_lock);
  return p;
}

/* Keep p for reuse when there is room; else free it. When full, the oldest entry goes. */
static void cache_put(void *p, size_t size) {
  pthread_mutex_lock(&cache_lock);
  cache_init();
  if (size > cache_cap) {
    pthread_mutex_unlock(&cache_lock);
    free(p);
    return;
  }
  void *evicted[CACHE_SLOTS];
  int n_evicted = 0;
  while (cache_count > 0 && (cache_count == CACHE_SLOTS || cache_bytes + size > cache_cap)) {
    evicted[n_evicted++] = cache[0].p;
    cache_bytes -= cache[0].size;
    memmove(&cache[0], &cache[1], (size_t)(cache_count - 1) * sizeof cache[0]);
    cache_count--;
  }
  cache[cache_count].p = p;
  cache[cache_count].size = size;
  cache_count++;
  cache_bytes += size;
  pthread_mutex_unlock(&cache_lock);
  for (int i = 0; i < n_evicted; i++) free(evicted[i]);
}

void ddp_memory_empty_cache(void) {
  pthread_mutex_lock(&cache_lock);
  for (int i = 0; i < cache_count; i++) free(cache[i].p);
  cache_count = 0;
  cache_bytes = 0;
  pthread_mutex_unlock(&cache_lock);
}

int64_t ddp_memory_cached_bytes(void) {
  pthread_mutex_lock(&cache_lock);
  int64_t n = (int64_t)cache_bytes;
  pthread_mutex_unlock(&cache_lock);
  return n;
}

static void count_alloc(size_t nbytes) {
  int64_t live = __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (live > peak &&
         !__atomic_compare_exchange_n(&peak_bytes, &peak, live, 1, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

void *ddp_alloc(size_t nbytes) {
  void *p;
  if (nbytes <= SMALL_BLOCK) {
    p = malloc(nbytes ? nbytes : 1);
  } else if (nbytes < CACHE_MIN) {
    p = aligned_alloc(DDP_ALIGNMENT, (nbytes + DDP_ALIGNMENT - 1) / DDP_ALIGNMENT * DDP_ALIGNMENT);
  } else {
    size_t size = large_size(nbytes);
    p = cache_take(size);
    if (!p) p = aligned_alloc(DDP_ALIGNMENT, size);
    if (!p) { /* the system refused: give the cache back and try once more */
      ddp_memory_empty_cache();
      p = aligned_alloc(DDP_ALIGNMENT, size);
    }
  }
  if (!p) return NULL;
  count_alloc(nbytes);
  return p;
}

void ddp_free(void *p, size_t nbytes) {
  if (!p) return;
  if (nbytes >= CACHE_MIN) cache_put(p, large_size(nbytes));
  else free(p);
  __atomic_sub_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
}

/* ---- small blocks (Note [small block cache] in core.h) -------------------------------- */

#if defined(__SANITIZE_ADDRESS__) && !defined(DDP_NO_BLOCK_CACHE)
#define DDP_NO_BLOCK_CACHE /* let ASan see every block */
#endif

#ifdef DDP_NO_BLOCK_CACHE

void *ddp_block_alloc(size_t nbytes) { return malloc(nbytes ? nbytes : 1); }
void ddp_block_free(void *p) { free(p); }

#else

enum { BLOCK_STEP = 64, BLOCK_CLASSES = 16, BLOCK_CLASS_CAP_BYTES = 8 << 20 };

typedef struct free_block { struct free_block *next; } free_block;
typedef struct {
  free_block *head[BLOCK_CLASSES];
  int32_t count[BLOCK_CLASSES];
  int registered; /* the thread-exit destructor knows this cache */
} block_cache;

static __thread block_cache blocks;
static pthread_key_t blocks_key;
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;

/* At thread exit: the thread's cached blocks go back to malloc. */
static void blocks_flush(void *arg) {
  block_cache *c = arg;
  for (int k = 0; k < BLOCK_CLASSES; k++) {
    while (c->head[k]) {
      free_block *b = c->head[k];
      c->head[k] = b->next;
      free(b);
    }
    c->count[k] = 0;
  }
  c->registered = 0;
}

static void blocks_key_init(void) { pthread_key_create(&blocks_key, blocks_flush); }

void *ddp_block_alloc(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  size_t k = (nbytes + BLOCK_STEP - 1) / BLOCK_STEP - 1; /* class k: (k + 1) * 64 bytes */
  if (k >= BLOCK_CLASSES) return malloc(nbytes);
  free_block *b = blocks.head[k];
  if (!b) return malloc((k + 1) * BLOCK_STEP);
  free_block *next = b->next;
  blocks.head[k] = next;
  blocks.count[k]--;
  /* the block after it serves the next request of this size: have its lines on the way
   * to the cache by then (it was freed in a batch, long after it was last used) */
  if (next)
    for (size_t line = 0; line <= k; line++) __builtin_prefetch((char *)next + line * BLOCK_STEP, 1);
  return b;
}

void ddp_block_free(void *p) {
  if (!p) return;
  /* The class the block can serve, from what malloc says it holds: a block from plain
   * malloc (of any size) is safe to cache too, it only serves requests it can hold. */
  size_t usable = malloc_usable_size(p);
  if (usable >= BLOCK_STEP) {
    size_t k = usable / BLOCK_STEP - 1;
    if (k >= BLOCK_CLASSES) k = BLOCK_CLASSES - 1;
    if (blocks.count[k] < BLOCK_CLASS_CAP_BYTES / (int32_t)((k + 1) * BLOCK_STEP)) {
      if (!blocks.registered) {
        pthread_once(&blocks_once, blocks_key_init);
        pthread_setspecific(blocks_key, &blocks);
        blocks.registered = 1;
      }
      free_block *b = p;
      b->next = blocks.head[k];
      blocks.head[k] = b;
      blocks.count[k]++;
      return;
    }
  }
  free(p);
}

#endif /* DDP_NO_BLOCK_CACHE */

void *ddp_alloc_block_counted(size_t nbytes) {
  void *p = ddp_block_alloc(nbytes);
  if (p) count_alloc(nbytes);
  return p;
}

void ddp_free_block_counted(void *p, size_t nbytes) {
  if (!p) return;
  ddp_block_free(p);
  __atomic_sub_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
}

int64_t ddp_memory_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t ddp_memory_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void ddp_memory_reset_peak(void) {
  __atomic_store_n(&peak_bytes, ddp_memory_live_bytes(), __ATOMIC_RELAXED);
}
