/* runtime/core/alloc.c: the CPU allocator. Counts live and peak bytes so the Lua front end
 * can tell its collector how much C memory its handles hold (DESIGN.md).
 *
 * Note [block cache]: a training step allocates the same large sizes every iteration
 * (activations, gradients, im2col buffers). Each large block is a fresh mapping whose pages
 * fault in on first touch, which once made an out-of-place add on 16 MiB four times slower
 * than the same add in place. Freed blocks of CACHE_MIN bytes and more are therefore kept
 * in a cache of page ranges and handed out again, in this order of preference:
 *   1. the most recently freed block of the request's page-rounded size, among the last
 *      RECENT blocks freed, when all its pages are still cached: exactly that block, taken
 *      out of the cached range that holds it (the parts before and after stay cached);
 *   2. a cached range of the request's size;
 *   3. the head of the smallest larger range (the tail stays cached);
 *   4. when a new mapping would take the process's tensor memory (live plus cached) past
 *      the most that was ever live: new address space into which the cached ranges' pages
 *      are moved (mremap moves page-table entries: no copy, no page fault), largest first,
 *      fresh pages covering what they do not;
 *   5. a new mapping (mmap).
 * A freed block merges with the cached ranges right before and after it, so pieces carved
 * from one range grow back into it. 1 gives a training step's buffer the place that a
 * buffer of its size had in the step before, pages still warm in cache and TLB, where
 * carving heads (3) handed each request whatever came first in the range: the MLP bench's
 * 800 KB weight gradient landed at 450-530 addresses over 820 steps (51 with 1, the
 * number of steps between two runs of the Lua collector, which frees the step's
 * tensors), and because the step's blocks go back where they were, the free space keeps
 * the same shape step after step: `ddplua train.lua` made 62 mmaps and 21 mremaps in an
 * epoch where carving alone made 170-800 and 250-1,560. RECENT covers some dozens of
 * steps' blocks. An exact-size cache (before the carving cache) kept blocks of sizes that
 * no request of the moment wanted (44 MiB in a CNN step whose tensors never passed
 * 26 MiB, the largest part of `ddplua train.lua`'s peak RSS, issue 16 part 4); with carving
 * and merging the cache settles at what the step needs (27 MiB there) and a training loop
 * reaches a state with no system call and no page fault per step (4 and 5 are for the
 * first steps, while the sizes settle). Large blocks are mapped directly rather than taken
 * from malloc: glibc raises its mmap threshold after a large free and then serves blocks
 * of up to 32 MiB from its heaps, where freed ones stay resident and cannot be carved. The
 * cache holds at most DDPLUA_CPU_CACHE_MB (default 1024) MiB and is emptied, and the
 * allocation retried, when the system refuses memory. ddp_memory_empty_cache() returns it
 * all. Small blocks come from plain malloc (glibc's per-thread cache is fast; memalign on
 * small blocks made glibc consolidate its fast bins on every call). Under AddressSanitizer
 * large blocks come from malloc (so that ASan sees each one) and only exact sizes are
 * reused. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "core/core.h"

static int64_t live_bytes, peak_bytes;
static int64_t allocated_bytes; /* every byte ever counted by count_alloc (never decreases) */
static int64_t most_live_bytes; /* the highest live_bytes ever (peak_bytes may be reset) */

enum { SMALL_BLOCK = 1024 };                 /* up to this: malloc, 16-byte aligned */
enum { CACHE_MIN = 64 * 1024 };              /* from this size up: mapped, cached when freed */
enum { CACHE_SLOTS = 512, PAGE = 4096 };     /* PAGE >= DDP_ALIGNMENT: mappings are aligned */
enum { RECENT = 512 }; /* freed blocks remembered for same-place reuse (Note [block cache]) */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t size; } cache[CACHE_SLOTS];
static int cache_count;
static size_t cache_bytes, cache_cap;
static int cache_ready;
/* the last RECENT blocks freed, newest at recent_next - 1 (a ring); size 0: none */
static struct { char *p; size_t size; } recent[RECENT];
static int recent_next;

/* ---- large blocks: whole pages, mapped (Note [block cache]) ---- */

#if defined(__SANITIZE_ADDRESS__)
#define CARVE 0 /* ASan sees malloc's blocks: exact-size reuse only */
static void *map_block(size_t size) { return aligned_alloc(DDP_ALIGNMENT, size); }
static void unmap_block(void *p, size_t size) { (void)size; free(p); }
#else
#define CARVE 1
static void *map_block(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}
static void unmap_block(void *p, size_t size) { munmap(p, size); }
#endif

/* Note [cache across fork]: the cached ranges are free memory, of no use to a child; left
 * as they are, fork copies their page tables and write-protects their pages on both sides,
 * so the child's first write to each cached page (its allocator hands them out again) copies
 * it and the parent's first write to each faults. A DataLoader worker forked after epochs of
 * num_workers = 0 spent 3% of its time so (the largest part of its system time). So while
 * fork runs, the cached ranges are MADV_DONTFORK: the child has no mapping there and starts
 * with an empty cache; the parent's ranges are MADV_DOFORK again once fork returns (a block
 * handed to a tensor later must be in the next child). cache_lock is held from before fork
 * until after, so no thread takes a range meanwhile. A range whose DONTFORK failed is still
 * in the child, unused there (the child's cache is empty); a range whose DOFORK failed must
 * never hold a tensor: its pages are given back and it leaves the cache (its address space
 * stays reserved). Only with CARVE (mapped blocks; under ASan they are malloc's). */
static void cache_remove(int i);

static void cache_before_fork(void) {
  pthread_mutex_lock(&cache_lock);
#if CARVE
  for (int i = 0; i < cache_count; i++) (void)madvise(cache[i].p, cache[i].size, MADV_DONTFORK);
#endif
}

static void cache_parent_after_fork(void) {
#if CARVE
  for (int i = 0; i < cache_count; i++) {
    if (madvise(cache[i].p, cache[i].size, MADV_DOFORK) == 0) continue;
    (void)madvise(cache[i].p, cache[i].size, MADV_DONTNEED);
    cache_remove(i--);
  }
#endif
  pthread_mutex_unlock(&cache_lock);
}

static void cache_child_after_fork(void) {
#if CARVE
  cache_count = 0; /* not mapped here (Note [cache across fork]) */
  cache_bytes = 0;
  for (int r = 0; r < RECENT; r++) recent[r].size = 0;
#endif
  pthread_mutex_init(&cache_lock, NULL);
}

/* Under cache_lock. */
static void cache_init(void) {
  if (cache_ready) return;
  const char *env = getenv("DDPLUA_CPU_CACHE_MB");
  long mb = env && *env ? atol(env) : 1024;
  cache_cap = mb > 0 ? (size_t)mb << 20 : 0;
  pthread_atfork(cache_before_fork, cache_parent_after_fork, cache_child_after_fork);
  cache_ready = 1;
}

/* The size a large request really takes: whole pages, so near sizes share blocks. */
static size_t large_size(size_t nbytes) { return (nbytes + PAGE - 1) / PAGE * PAGE; }

/* Under cache_lock: drop entry i. */
static void cache_remove(int i) {
  cache_bytes -= cache[i].size;
  memmove(&cache[i], &cache[i + 1], (size_t)(cache_count - i - 1) * sizeof cache[0]);
  cache_count--;
}

/* A block of `size` bytes of cached pages, or NULL when the cache cannot give one
 * (Note [block cache]): a recently freed block of that size still wholly cached, else a
 * cached block of that size, else the head of the smallest larger one (its tail stays
 * cached), else, past the most ever live, new address space holding the cached pages. */
static void *cache_take(size_t size) {
  pthread_mutex_lock(&cache_lock);
  cache_init();
  void *p = NULL;
  /* a recently freed block of this size whose pages are all still cached: take exactly it,
   * splitting the cached range around it (Note [block cache]) */
  for (int k = 1; CARVE && k <= RECENT && cache_count < CACHE_SLOTS; k++) {
    int r = (recent_next - k + RECENT) % RECENT;
    if (recent[r].size != size) continue;
    char *q = recent[r].p;
    recent[r].size = 0;
    for (int i = 0; i < cache_count; i++) {
      char *b = cache[i].p, *e = b + cache[i].size;
      if (q < b || q + size > e) continue;
      if (q + size < e) { /* the part after it: a new entry right after i */
        memmove(&cache[i + 2], &cache[i + 1], (size_t)(cache_count - i - 1) * sizeof cache[0]);
        cache[i + 1].p = q + size;
        cache[i + 1].size = (size_t)(e - (q + size));
        cache_count++;
      }
      cache[i].size = (size_t)(q - b); /* the part before it */
      cache_bytes -= size;
      if (q == b) cache_remove(i); /* nothing before it: removing subtracts 0 bytes */
      p = q;
      break;
    }
    if (p) {
      pthread_mutex_unlock(&cache_lock);
      return p;
    }
  }
  int exact = -1, larger = -1;
  for (int i = cache_count - 1; i >= 0; i--) {
    if (cache[i].size == size) {
      exact = i;
      break;
    }
    if (cache[i].size > size && (larger < 0 || cache[i].size < cache[larger].size)) larger = i;
  }
  if (exact >= 0) {
    p = cache[exact].p;
    cache_remove(exact);
  } else if (CARVE && larger >= 0) {
    p = cache[larger].p;
    cache[larger].p = (char *)p + size; /* the tail stays cached, its pages in place */
    cache[larger].size -= size;
    cache_bytes -= size;
  } else if (CARVE && cache_count > 0 &&
             __atomic_load_n(&live_bytes, __ATOMIC_RELAXED) + (int64_t)(cache_bytes + size) >
                 __atomic_load_n(&most_live_bytes, __ATOMIC_RELAXED)) {
    /* new pages would take the process past the most it ever had live: move the cached
     * blocks' pages into new address space instead, largest first (mremap moves page-table
     * entries: no copy, no page faults); fresh pages fill what they do not cover */
    p = map_block(size);
    size_t filled = 0;
    while (p && filled < size && cache_count > 0) {
      int big = 0;
      for (int i = 1; i < cache_count; i++)
        if (cache[i].size > cache[big].size) big = i;
      size_t part = cache[big].size < size - filled ? cache[big].size : size - filled;
      if (mremap(cache[big].p, part, part, MREMAP_MAYMOVE | MREMAP_FIXED, (char *)p + filled) ==
          MAP_FAILED)
        break; /* the rest stays fresh pages */
      filled += part;
      if (part == cache[big].size) cache_remove(big);
      else {
        cache[big].p = (char *)cache[big].p + part;
        cache[big].size -= part;
        cache_bytes -= part;
      }
    }
  }
  pthread_mutex_unlock(&cache_lock);
  return p;
}

/* Remember p among the RECENT freed blocks and keep it for reuse when there is room, merged
 * with the cached blocks right before and after it (pieces carved from one block grow back
 * into it); else unmap it. When full, the oldest entry goes. */
static void cache_put(void *p, size_t size) {
  pthread_mutex_lock(&cache_lock);
  cache_init();
  recent[recent_next].p = p;
  recent[recent_next].size = size;
  recent_next = (recent_next + 1) % RECENT;
  if (size > cache_cap) {
    pthread_mutex_unlock(&cache_lock);
    unmap_block(p, size);
    return;
  }
  for (int i = CARVE ? cache_count - 1 : -1; i >= 0; i--) {
    if ((char *)cache[i].p + cache[i].size == (char *)p) { /* a cached block just before */
      p = cache[i].p;
      size += cache[i].size;
      cache_remove(i);
    } else if ((char *)p + size == (char *)cache[i].p) { /* one just after */
      size += cache[i].size;
      cache_remove(i);
    } else continue;
    i = cache_count; /* the merged block may now touch another: look again */
  }
  struct { void *p; size_t size; } evicted[CACHE_SLOTS];
  int n_evicted = 0;
  while (cache_count > 0 && (cache_count == CACHE_SLOTS || cache_bytes + size > cache_cap)) {
    evicted[n_evicted].p = cache[0].p;
    evicted[n_evicted++].size = cache[0].size;
    cache_remove(0);
  }
  cache[cache_count].p = p;
  cache[cache_count].size = size;
  cache_count++;
  cache_bytes += size;
  pthread_mutex_unlock(&cache_lock);
  for (int i = 0; i < n_evicted; i++) unmap_block(evicted[i].p, evicted[i].size);
}

void ddp_memory_empty_cache(void) {
  pthread_mutex_lock(&cache_lock);
  for (int i = 0; i < cache_count; i++) unmap_block(cache[i].p, cache[i].size);
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
  __atomic_add_fetch(&allocated_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
  int64_t live = __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (live > peak &&
         !__atomic_compare_exchange_n(&peak_bytes, &peak, live, 1, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  int64_t most = __atomic_load_n(&most_live_bytes, __ATOMIC_RELAXED);
  while (live > most &&
         !__atomic_compare_exchange_n(&most_live_bytes, &most, live, 1, __ATOMIC_RELAXED,
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
    if (!p) p = map_block(size);
    if (!p) { /* the system refused: give the cache back and try once more */
      ddp_memory_empty_cache();
      p = map_block(size);
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

/* Note [block list trim]: blocks made on one thread and freed on another (a batch's tensor
 * headers, made by the loader's prefetch thread, released by the training loop's collector)
 * join the freeing thread's lists, which its own allocations never drain: the lists grew by
 * about 1 KB per training step (1.3 MiB of peak RSS per epoch of `ddplua train.lua`, more
 * with every epoch, up to 8 MiB a class) while the making thread's malloc arena grew as much.
 * So every TRIM_EVERY frees, a thread gives back to malloc the blocks of each class that its
 * allocations did not need since the last trim: as many as the fewest the class held in
 * that period (its low-water mark), the coldest ones (the tail of the last-in first-out
 * list). A list that empties now and then (a loop of small ops, a training step) keeps
 * everything; a list that only grows loses the growth, which malloc then hands to the
 * making thread again. Costs one compare per allocation and one count per free. */
enum { BLOCK_STEP = 64, BLOCK_CLASSES = 16, BLOCK_CLASS_CAP_BYTES = 8 << 20 };
enum { TRIM_EVERY = 1 << 12 }; /* frees per trim (Note [block list trim]) */

typedef struct free_block { struct free_block *next; } free_block;
typedef struct {
  free_block *head[BLOCK_CLASSES];
  int32_t count[BLOCK_CLASSES];
  int32_t low[BLOCK_CLASSES]; /* the fewest blocks class k held since the last trim */
  int32_t frees;              /* blocks cached since the last trim */
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
    c->low[k] = 0;
  }
  c->registered = 0;
}

static void blocks_key_init(void) { pthread_key_create(&blocks_key, blocks_flush); }

/* Give back the blocks of each class that no allocation needed since the last trim: the
 * tail of the list past its first count - low blocks (Note [block list trim]). */
static void blocks_trim(block_cache *c) {
  for (int k = 0; k < BLOCK_CLASSES; k++) {
    int32_t surplus = c->low[k], keep = c->count[k] - surplus;
    if (surplus > 0) {
      free_block **link = &c->head[k];
      for (int32_t i = 0; i < keep; i++) link = &(*link)->next;
      free_block *b = *link;
      *link = NULL;
      while (b) {
        free_block *next = b->next;
        free(b);
        b = next;
      }
      c->count[k] = keep;
    }
    c->low[k] = c->count[k];
  }
  c->frees = 0;
}

void *ddp_block_alloc(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  size_t k = (nbytes + BLOCK_STEP - 1) / BLOCK_STEP - 1; /* class k: (k + 1) * 64 bytes */
  if (k >= BLOCK_CLASSES) return malloc(nbytes);
  free_block *b = blocks.head[k];
  if (!b) return malloc((k + 1) * BLOCK_STEP);
  free_block *next = b->next;
  blocks.head[k] = next;
  if (--blocks.count[k] < blocks.low[k]) blocks.low[k] = blocks.count[k];
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
      if (++blocks.frees == TRIM_EVERY) blocks_trim(&blocks);
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
int64_t ddp_memory_allocated_bytes(void) {
  return __atomic_load_n(&allocated_bytes, __ATOMIC_RELAXED);
}
int64_t ddp_memory_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void ddp_memory_reset_peak(void) {
  __atomic_store_n(&peak_bytes, ddp_memory_live_bytes(), __ATOMIC_RELAXED);
}
