// runtime/backend/sim/emul_plugin.cc: the emulated CUDA device, a test double built as
// build/libddplua_cuda_emul.so (`make emulation`, where CUDA's headers exist). It is the
// simulated device (libddplua_cuda_sim.so, opened from beside this library: host memory,
// streams and events, the CPU kernels) whose kernel table is handed to the register
// function of every CUDA area that runs without a vendor library (elementwise, reduce,
// pool, loss, norm, optim, shape): those .cu files, unchanged, compiled for the host under
// runtime/backend/sim/cuda_emulation.h. The cuBLAS, cuDNN and NCCL areas (matmul, conv,
// collectives) stay on the simulated device's CPU kernels. Its name is "cuda-emulated".
//
// This file also holds what those .cu files take from the rest of the real plug-in
// (runtime/backend/cuda/plugin.cu, allocator.cu): the stream, the device, error recording,
// scratch memory; the CUDA runtime calls their host code makes, on host memory; and the
// block scheduler of Note [block emulation].
#include "backend/sim/cuda_emulation.h"

#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <vector>

#include "backend/cuda/cuda_internal.h"

// ---- the block scheduler (Note [block emulation]) -----------------------------------------

namespace ddp_emul {
namespace {

constexpr size_t STACK_BYTES = 256 * 1024; // per CUDA thread; mapped once, touched lazily
constexpr unsigned MAX_THREADS = 1024;

// Each thread slot is a coroutine on its own stack, entered once through a ucontext
// (setcontext) and kept for later launches: it runs the job of one CUDA thread, parks, and
// runs the next block's when resumed. Switches are _setjmp/_longjmp, which keep the signal
// mask and so make no system call.
struct Thread {
  ucontext_t ctx;
  jmp_buf jb;
  char *stack = nullptr;
  bool entered = false, done = false;
};

std::recursive_mutex launch_lock; // one launch at a time (the scheduler state is global)
jmp_buf scheduler;
Thread threads[MAX_THREADS];
const std::function<void()> *job;
unsigned running;                 // linear index of the running thread
bool direct;                      // the block's threads run as plain calls
bool reached_barrier;             // some thread of this block reached a barrier
unsigned live;                    // threads of the block not finished
unsigned block_arrived, block_gen;
unsigned warp_live[MAX_THREADS / 32], warp_arrived[MAX_THREADS / 32], warp_gen[MAX_THREADS / 32];
unsigned long progress;           // arrivals, releases and exits: a round without any is a deadlock

[[noreturn]] void fatal(const char *what) {
  fprintf(stderr, "cuda emulation: %s (block %u,%u,%u thread %u,%u,%u)\n", what, block_idx.x,
          block_idx.y, block_idx.z, thread_idx.x, thread_idx.y, thread_idx.z);
  abort();
}

void set_position(unsigned lin) {
  running = lin;
  thread_idx = dim3(lin % block_dim.x, lin / block_dim.x % block_dim.y,
                    lin / (block_dim.x * block_dim.y));
}

void yield(void) {
  if (!_setjmp(threads[running].jb)) _longjmp(scheduler, 1);
}

// Run thread i until it yields or finishes.
void resume(unsigned i) {
  set_position(i);
  if (_setjmp(scheduler)) return;
  if (threads[i].entered) _longjmp(threads[i].jb, 1);
  threads[i].entered = true;
  setcontext(&threads[i].ctx);
}

// Arrive at a barrier counted by (arrived, gen) over `members` live threads and wait until
// all of them have.
void barrier(unsigned &arrived, unsigned &gen, unsigned members) {
  if (direct) fatal("a barrier in a kernel whose thread 0 reached none");
  reached_barrier = true;
  progress++;
  unsigned my_gen = gen;
  if (++arrived == members) {
    arrived = 0;
    gen++;
    return;
  }
  while (gen == my_gen) yield();
}

void finish(unsigned me) {
  // leave the counts; a barrier now complete without this thread opens
  const unsigned w = me / 32;
  threads[me].done = true;
  progress++;
  live--;
  warp_live[w]--;
  if (block_arrived && block_arrived == live) block_arrived = 0, block_gen++;
  if (warp_arrived[w] && warp_arrived[w] == warp_live[w]) warp_arrived[w] = 0, warp_gen[w]++;
}

void slot_main(void) {
  const unsigned me = running;
  for (;;) {
    (*job)();
    finish(me);
    if (!_setjmp(threads[me].jb)) _longjmp(scheduler, 1); // park until the next start
  }
}

// Make thread i of the block ready to start.
void start_thread(unsigned i) {
  Thread &t = threads[i];
  if (!t.stack) {
    void *m = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fatal("cannot map a thread stack");
    t.stack = (char *)m;
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack;
    t.ctx.uc_stack.ss_size = STACK_BYTES;
    t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, slot_main, 0);
  }
  t.done = false;
}

void run_block(unsigned n) {
  direct = false;
  reached_barrier = false;
  live = n;
  block_arrived = block_gen = 0;
  for (unsigned w = 0; w < (n + 31) / 32; w++) {
    warp_live[w] = n - w * 32 < 32 ? n - w * 32 : 32;
    warp_arrived[w] = warp_gen[w] = 0;
  }
  // thread 0 first: if it finishes without a barrier, the rest are plain calls
  start_thread(0);
  resume(0);
  if (threads[0].done && !reached_barrier) {
    direct = true;
    for (unsigned i = 1; i < n; i++) {
      set_position(i);
      (*job)();
    }
    direct = false;
    return;
  }
  for (unsigned i = 1; i < n; i++) start_thread(i);
  for (unsigned finished = 0; finished < n;) {
    unsigned long before = progress;
    finished = 0;
    for (unsigned i = 0; i < n; i++) {
      if (threads[i].done) {
        finished++;
        continue;
      }
      resume(i);
    }
    if (finished < n && progress == before) fatal("deadlock: threads wait at different barriers");
  }
}

} // namespace

void launch(dim3 grid, dim3 block, const std::function<void()> &f) {
  std::lock_guard<std::recursive_mutex> hold(launch_lock);
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > MAX_THREADS) fatal("a block of 0 or more than 1024 threads");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) fatal("an empty grid");
  grid_dim = grid;
  block_dim = block;
  job = &f;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        block_idx = dim3(bx, by, bz);
        run_block(n);
      }
}

void sync_block(void) { barrier(block_arrived, block_gen, live); }
void sync_warp(unsigned warp) { barrier(warp_arrived[warp], warp_gen[warp], warp_live[warp]); }

} // namespace ddp_emul

// ---- the simulated device underneath ------------------------------------------------------

static const ddp_cuda_api *sim; // libddplua_cuda_sim.so's table

// Note [deferred errors] (cuda_internal.h), as runtime/backend/cuda/plugin.cu.
static thread_local int deferred_status;
static thread_local char deferred_message[512];

void ddp_cuda_defer_error(int status, const char *fmt, ...) {
  if (deferred_status) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(deferred_message, sizeof deferred_message, fmt, ap);
  va_end(ap);
  deferred_status = status ? status : DDP_ERR_STATE;
}

static int check(const char *op) {
  if (deferred_status) {
    int status = deferred_status;
    deferred_status = 0;
    return ddp_fail_at(__FILE__, __LINE__, status, "%s: %s", op, deferred_message);
  }
  return sim->check(op);
}

int ddp_cuda_fail(cudaError_t err, const char *op, const char *what, const char *file, int line) {
  return ddp_fail_at(file, line, DDP_ERR_STATE, "%s: %s failed: emulated CUDA error %d", op,
                     what, (int)err);
}

cudaStream_t ddp_cuda_stream(void) { return nullptr; } // kernels finish at their launch

int ddp_cuda_device(void) {
  int d = 0;
  sim->get_device(&d);
  return d;
}

int ddp_cuda_use_device(int device, const char *op) { return sim->set_device(device); }

cudaError_t ddp_cuda_query_event(cudaEvent_t) { return cudaSuccess; }

int ddp_cuda_allow_tf32 = 0;

extern "C" int ddp_cuda_caching_malloc(void **out, int device, size_t nbytes) {
  return sim->malloc(out, device, nbytes);
}
extern "C" void ddp_cuda_caching_free(void *p) { sim->free(p); }

// ---- the CUDA runtime calls of the kernels' host code, on host memory ----------------------
// Kernels have finished when their launch returns: a copy is a memmove, a wait returns.

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *device) {
  *device = ddp_cuda_device();
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t) {
  memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t) {
  memset(dst, value, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t n, size_t offset,
                                      cudaMemcpyKind, cudaStream_t) {
  memcpy(dst, (const char *)symbol + offset, n);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}

// ---- the plug-in --------------------------------------------------------------------------

extern "C" const ddp_cuda_api *ddp_cuda_plugin_api(void) {
  static ddp_cuda_api api;
  static ddp_kernels kernels;
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info;
    char path[4096];
    if (!dladdr((void *)ddp_cuda_plugin_api, &info) || !info.dli_fname) return;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    snprintf(path + dir, sizeof path - dir, "libddplua_cuda_sim.so");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    auto get = h ? (const ddp_cuda_api *(*)(void))dlsym(h, "ddp_cuda_plugin_api") : nullptr;
    const ddp_cuda_api *base = get ? get() : nullptr;
    if (!base || !base->kernels) return;
    kernels = *base->kernels;
    ddp_cuda_register_elementwise(&kernels);
    ddp_cuda_register_reduce(&kernels);
    ddp_cuda_register_pool(&kernels);
    ddp_cuda_register_loss(&kernels);
    ddp_cuda_register_norm(&kernels);
    ddp_cuda_register_optim(&kernels);
    ddp_cuda_register_shape(&kernels);
    ddp_cuda_register_attention(&kernels);
    ddp_cuda_register_collective(&kernels);
    api = *base;
    api.name = "cuda-emulated";
    api.kernels = &kernels;
    api.check = check;
    sim = base;
  });
  return sim ? &api : nullptr;
}
