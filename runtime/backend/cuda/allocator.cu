// runtime/backend/cuda/allocator.cu: the caching device allocator.
//
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so freed
// blocks are kept and handed out again, as PyTorch's CUDACachingAllocator does (a much
// simpler version: no block splitting).
//  - Requests are rounded up: to 512 bytes below 1 MiB, to 2 MiB above, so sizes that
//    differ a little land in the same class.
//  - A free block is cached under (device, stream it was allocated for). A later request
//    on the same stream may reuse it at once: work on one stream runs in order, so the
//    new owner's kernels run after the old owner's. A request never takes a block cached
//    for another stream.
//  - record_stream(p, s) says block p is also used on stream s. When such a block is freed
//    an event is recorded on each of those streams, and the block is cached only once the
//    events have completed (polled at the next request).
//  - When cudaMalloc fails for lack of memory, the device is synchronised (so blocks
//    waiting for their events become free), every cached block of the device is freed and
//    it is tried once more; then the error says how much was asked for, allocated and
//    reserved. Other cudaMalloc errors are reported as they are.
//
// Checked on the host against a fake CUDA runtime (spec/fixtures/allocator_emulation.cc, a
// test program built by make, run by spec/cuda/allocator_emulation_spec.lua).
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_internal.h"

namespace {

enum : size_t { SMALL = 1 << 20, SMALL_ROUND = 512, LARGE_ROUND = 2 << 20 };
enum { MAX_DEVICES = 64 };

struct Block {
  void *ptr;
  size_t size;
  int device;
  cudaStream_t stream;                  // the stream it was allocated for
  std::vector<cudaStream_t> uses;       // other streams (record_stream)
  std::vector<cudaEvent_t> pending;     // events to pass before it can be cached
};

using Key = std::tuple<int, cudaStream_t, size_t>; // device, stream, size

std::mutex lock;
std::unordered_map<void *, Block *> live;       // handed out
std::multimap<Key, Block *> cached;             // free, reusable
std::vector<Block *> waiting;                   // freed, events pending
ddp_cuda_memory_stats stats[MAX_DEVICES];

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  size_t r = n < SMALL ? SMALL_ROUND : LARGE_ROUND;
  return (n + r - 1) / r * r;
}

void count_alloc(Block *b) {
  ddp_cuda_memory_stats &s = stats[b->device];
  s.allocated += (int64_t)b->size;
  if (s.allocated > s.max_allocated) s.max_allocated = s.allocated;
  s.alloc_calls++;
}

// Move blocks whose events have all completed from `waiting` into the cache.
void collect_waiting() {
  for (size_t i = 0; i < waiting.size();) {
    Block *b = waiting[i];
    bool done = true;
    // ddp_cuda_query_event clears "not ready" without dropping an error that was pending
    // before (a blanket cudaGetLastError here swallowed e.g. a failed kernel launch that
    // the op's ddp_device_check had yet to report); a query that fails otherwise counts as
    // done (the block is not held forever) and its error goes to the next check
    for (cudaEvent_t e : b->pending)
      if (ddp_cuda_query_event(e) == cudaErrorNotReady) done = false;
    if (!done) {
      i++;
      continue;
    }
    for (cudaEvent_t e : b->pending) cudaEventDestroy(e);
    b->pending.clear();
    b->uses.clear();
    cached.emplace(Key{b->device, b->stream, b->size}, b);
    waiting[i] = waiting.back();
    waiting.pop_back();
  }
}

// cudaFree every cached block of `device` (-1: all devices). Caller holds the lock.
int release_cached(int device) {
  for (auto it = cached.begin(); it != cached.end();) {
    Block *b = it->second;
    if (device >= 0 && b->device != device) {
      ++it;
      continue;
    }
    DDP_TRY(ddp_cuda_use_device(b->device, "empty_cache"));
    cudaError_t err = cudaFree(b->ptr);
    stats[b->device].reserved -= (int64_t)b->size;
    it = cached.erase(it);
    delete b;
    if (err != cudaSuccess)
      return ddp_cuda_fail(err, "empty_cache", "cudaFree", __FILE__, __LINE__);
  }
  return DDP_OK;
}

} // namespace

extern "C" int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes) {
  *out = NULL;
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_ARG, "cuda malloc: invalid device %d", device);
  DDP_TRY(ddp_cuda_use_device(device, "cuda malloc"));
  cudaStream_t stream = ddp_cuda_stream();
  size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> guard(lock);
  if (!waiting.empty()) collect_waiting();
  // The smallest cached block of this device and stream that fits, unless it is more
  // than a quarter larger than asked (then a fresh block wastes less).
  auto it = cached.lower_bound(Key{device, stream, size});
  if (it != cached.end() && std::get<0>(it->first) == device &&
      std::get<1>(it->first) == stream && it->second->size <= size + size / 4) {
    Block *b = it->second;
    cached.erase(it);
    live[b->ptr] = b;
    count_alloc(b);
    *out = b->ptr;
    return DDP_OK;
  }
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, size);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    // Wait for the device, so that blocks freed with record_stream events pending can be
    // cached (their events have completed), then free every cached block of the device.
    cudaDeviceSynchronize();
    if (!waiting.empty()) collect_waiting();
    DDP_TRY(release_cached(device));
    DDP_TRY(ddp_cuda_use_device(device, "cuda malloc"));
    err = cudaMalloc(&p, size);
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const ddp_cuda_memory_stats &s = stats[device];
    DDP_FAIL(DDP_ERR_MEMORY,
             "CUDA out of memory: tried to allocate %.2f MiB (%zu bytes) on cuda:%d (%.2f MiB "
             "allocated by tensors, %.2f MiB reserved): %s",
             size / 1048576.0, size, device, s.allocated / 1048576.0, s.reserved / 1048576.0,
             cudaGetErrorName(err));
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return ddp_cuda_fail(err, "cuda malloc", "cudaMalloc", __FILE__, __LINE__);
  }
  Block *b = new Block{p, size, device, stream, {}, {}};
  live[p] = b;
  stats[device].reserved += (int64_t)size;
  if (stats[device].reserved > stats[device].max_reserved)
    stats[device].max_reserved = stats[device].reserved;
  stats[device].cuda_malloc_calls++;
  count_alloc(b);
  *out = p;
  return DDP_OK;
}

extern "C" void ddp_cuda_caching_free(void *p) {
  if (!p) return;
  std::lock_guard<std::mutex> guard(lock);
  auto it = live.find(p);
  if (it == live.end()) return; // not ours: never free what we did not hand out
  Block *b = it->second;
  live.erase(it);
  stats[b->device].allocated -= (int64_t)b->size;
  if (b->uses.empty()) {
    cached.emplace(Key{b->device, b->stream, b->size}, b);
    return;
  }
  int previous = ddp_cuda_device();
  cudaSetDevice(b->device);
  for (cudaStream_t s : b->uses) {
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
      if (cudaEventRecord(e, s) == cudaSuccess) {
        b->pending.push_back(e);
        continue;
      }
      // Not recordable (a stream of another device than the block's): an event never
      // recorded counts as complete, which would cache the block while s may still use it.
      cudaEventDestroy(e);
    }
    cudaGetLastError();
    cudaStreamSynchronize(s); // no event to poll: wait here instead
  }
  cudaSetDevice(previous);
  waiting.push_back(b);
}

extern "C" int ddp_cuda_caching_record_stream(void *p, void *stream) {
  std::lock_guard<std::mutex> guard(lock);
  auto it = live.find(p);
  if (it == live.end())
    DDP_FAIL(DDP_ERR_ARG, "record_stream: %p is not a block of the CUDA caching allocator", p);
  Block *b = it->second;
  cudaStream_t s = (cudaStream_t)stream;
  if (s == b->stream) return DDP_OK;
  for (cudaStream_t u : b->uses)
    if (u == s) return DDP_OK;
  b->uses.push_back(s);
  return DDP_OK;
}

extern "C" int ddp_cuda_caching_empty_cache(void) {
  std::lock_guard<std::mutex> guard(lock);
  int previous = ddp_cuda_device();
  if (!waiting.empty()) collect_waiting();
  int status = release_cached(-1);
  cudaSetDevice(previous);
  return status;
}

extern "C" int ddp_cuda_caching_stats(int device, ddp_cuda_memory_stats *out) {
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_ARG, "memory_stats: invalid device %d", device);
  std::lock_guard<std::mutex> guard(lock);
  *out = stats[device];
  return DDP_OK;
}

extern "C" int ddp_cuda_caching_reset_peak(int device) {
  if (device < 0 || device >= MAX_DEVICES)
    DDP_FAIL(DDP_ERR_ARG, "reset_peak_memory_stats: invalid device %d", device);
  std::lock_guard<std::mutex> guard(lock);
  stats[device].max_allocated = stats[device].allocated;
  stats[device].max_reserved = stats[device].reserved;
  return DDP_OK;
}
