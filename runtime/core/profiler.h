/* runtime/core/profiler.h: what the runtime's producers call to append to the profiler's
 * event stream (the public side is ddplua/profiler.h; Note [profiler events] in
 * runtime/core/profiler.c). It lives in the core, the bottom layer, so that every layer
 * (backend dispatch, tape, autograd, io, distributed) can record.
 *
 * Each entry point is meant to be called behind DDP_PROF_ON(), one predictable branch on a
 * global flag, so that a producer costs nothing measurable while recording is off:
 *
 *     int64_t t0 = DDP_PROF_ON() ? ddp_prof_now() : 0;
 *     ... the work ...
 *     if (t0) ddp_prof_record("DataLoader.__next__", DDP_PROF_LOADER, t0, -1, -1, NULL); */
#ifndef DDP_CORE_PROFILER_H
#define DDP_CORE_PROFILER_H

#include <stdint.h>

#include "core/core.h"

/* 1 while recording is on (ddp_profiler_start .. ddp_profiler_stop); read without a lock:
 * a producer that sees a stale value records one event more or less, never a torn one. */
extern volatile int ddp_prof_active;

#define DDP_PROF_ON() __builtin_expect(ddp_prof_active, 0)

/* CLOCK_MONOTONIC in ns (ddp_profiler_now_ns). */
int64_t ddp_prof_now(void);

/* Record a complete event [begin_ns, now] of `category` named `name` (a string that lives
 * as long as the process: a literal or a static table entry) on the calling thread. bytes
 * and arg as in ddp_prof_event (-1: none); detail is copied (NULL: ""). No-op when off. */
void ddp_prof_record(const char *name, int category, int64_t begin_ns, int64_t bytes,
                     int64_t arg, const char *detail);

/* The same with an explicit end (end_ns >= begin_ns; an instant event when equal). */
void ddp_prof_record_span(const char *name, int category, int64_t begin_ns, int64_t end_ns,
                          int64_t bytes, int64_t arg, const char *detail);

/* The op bracket of the one dispatch path (Note [profiler events]): ddp_kernels_for (and a
 * new storage) call ddp_prof_kernel_begin, ddp_device_check calls ddp_prof_kernel_end(op)
 * after the kernels ran; the pair becomes one DDP_PROF_OP event named op. Only behind
 * DDP_PROF_ON(). */
void ddp_prof_kernel_begin(void);
void ddp_prof_kernel_end(const char *op);
/* Drop the open op bracket of this thread, if any (an event of another kind begins or
 * ends: what was opened before it belongs to no op). */
void ddp_prof_kernel_cancel(void);

/* Called by the tape when an op records its autograd node, right after the op's kernels:
 * when the thread's last event is that op's, extend it to now (recording the node is part
 * of the op) and, with DDP_PROF_RECORD_SHAPES, attach the shapes of inputs[0 .. n-1] (NULLs
 * written "[]") when it has none yet (Note [profiler shapes]). Only behind DDP_PROF_ON(). */
void ddp_prof_note_inputs(int n, ddp_tensor *const *inputs);

#endif /* DDP_CORE_PROFILER_H */
