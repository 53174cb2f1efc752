/* runtime/core/alloc.c: the aligned CPU allocator; counts live and peak bytes so the Lua
 * front end can tell its collector how much C memory its handles hold (DESIGN.md). */
#include <stdlib.h>

#include "core/core.h"

static int64_t live_bytes, peak_bytes;

/* Blocks up to this size come from plain malloc (16-byte aligned, glibc's fast per-thread
 * cache); memalign on small blocks makes glibc consolidate its fast bins on every call,
 * which once cost more than the op itself for small tensors. */
enum { SMALL_BLOCK = 1024 };

void *ddp_alloc(size_t nbytes) {
  void *p;
  if (nbytes <= SMALL_BLOCK) {
    p = malloc(nbytes ? nbytes : 1);
  } else {
    size_t rounded = (nbytes + DDP_ALIGNMENT - 1) / DDP_ALIGNMENT * DDP_ALIGNMENT;
    p = aligned_alloc(DDP_ALIGNMENT, rounded);
  }
  if (!p) return NULL;
  int64_t live = __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
  int64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (live > peak &&
         !__atomic_compare_exchange_n(&peak_bytes, &peak, live, 1, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return p;
}

void ddp_free(void *p, size_t nbytes) {
  if (!p) return;
  free(p);
  __atomic_sub_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
}

int64_t ddp_memory_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t ddp_memory_peak_bytes(void) { return __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED); }
void ddp_memory_reset_peak(void) {
  __atomic_store_n(&peak_bytes, ddp_memory_live_bytes(), __ATOMIC_RELAXED);
}
