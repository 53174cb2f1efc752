/* runtime/comm/functional.c: differentiable collectives (ddplua/dist_functional.h),
 * recorded on the autograd tape like any op (runtime/tape/tape.h).
 *
 * Each front door checks its arguments, runs the forward collective with grad mode off on
 * a fresh contiguous tensor through the process group's front door (ddplua/pg.h, blocking),
 * then, when the input needs a gradient, records a single-input node whose backward
 * function runs the adjoint collective. The node keeps what its backward needs in an
 * op-owned block (node->extra, struct coll_ctx): the group, this rank, the reduce op, the
 * root or dim, the output's shape (for a backward without a gradient: Note [collectives on
 * the tape] in ddplua/dist_functional.h) and the forward's call site. Nothing is saved: the
 * adjoints are linear maps that need no forward values.
 *
 * Layout (Note [rank-major layout]): the group's tensor collectives gather and scatter along
 * dim 0 ((world, ...) or (world * k, ...)). A gather or scatter along dim d > 0 goes through
 * a rank-major buffer (world, s0, .., k, .., sn): to_rank_major moves the world-sized block
 * of dim d to the front (a view (s0, .., world, k, .., sn), permuted and made contiguous)
 * and from_rank_major undoes it. For d == 0 both are plain views.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "tape/tape.h"
#include "comm/pg_internal.h"

/* What a backward function needs (node->extra, freed with the node). */
typedef struct {
  ddp_pg *pg;
  int rank, world;
  int op;   /* enum ddp_reduce_op (all_reduce, reduce, reduce_scatter_tensor) */
  int root; /* group rank (broadcast, reduce, gather, scatter) */
  int dim;  /* 0-based (all_gather_tensor, reduce_scatter_tensor) */
  int out_ndim, out_dtype, out_device;
  int64_t out_shape[DDP_MAX_DIMS];
  char site[PG_SITE_CAP]; /* the forward's call site, "" when none */
  int64_t *out_splits, *in_splits; /* all_to_all_single: world entries each, or NULL (even) */
} coll_ctx;

static void ctx_free(void *p) {
  coll_ctx *c = p;
  if (!c) return;
  free(c->out_splits);
  free(c->in_splits);
  free(c);
}

/* Run expr with grad mode off (the forward's own ops must not record nodes). */
#define NO_GRAD(status, expr)                                                              \
  do {                                                                                     \
    int prev_ = ddp_set_grad_enabled(0);                                                   \
    (status) = (expr);                                                                     \
    ddp_set_grad_enabled(prev_);                                                           \
  } while (0)

/* The checks every front door starts with: out, the group and a live input (*out = NULL). */
static int check_args(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, const char *name) {
  if (!out) DDP_FAIL(DDP_ERR_ARG, "%s: out is NULL", name);
  *out = NULL;
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "%s: group is NULL", name);
  return ddp_check_alive(in, name, "tensor");
}

/* root (`what`: "src" or "dst") must be a group rank. */
static int check_root(ddp_pg *pg, int root, const char *name, const char *what) {
  int w = ddp_pg_size(pg);
  if (root < 0 || root >= w)
    DDP_FAIL(DDP_ERR_ARG, "%s: %s %d is out of range for a group of %d ranks", name, what, root, w);
  return DDP_OK;
}

/* The rank-major buffer adds a dim: in may have at most DDP_MAX_DIMS - 1. */
static int check_ndim(const ddp_tensor *in, const char *name) {
  if (in->ndim == 0)
    DDP_FAIL(DDP_ERR_ARG, "%s: input must have at least one dimension (a 0-d tensor was given)",
             name);
  if (in->ndim >= DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "%s: input has %d dimensions (at most %d)", name, in->ndim,
             DDP_MAX_DIMS - 1);
  return DDP_OK;
}

/* op must be an enum ddp_reduce_op. */
static int check_op(int op, const char *name) {
  if (!ddp_reduce_op_name(op))
    DDP_FAIL(DDP_ERR_ARG, "%s: unknown reduce op %d", name, op);
  return DDP_OK;
}

/* The backward of a reduction made with `op` is defined for a sum only (PyTorch's
 * functional collectives: "all_reduce backward only supports 'sum' reduction, got 'max'"). */
static int check_sum_backward(const coll_ctx *c, const char *name) {
  if (c->op != DDP_REDUCE_SUM)
    DDP_FAIL(DDP_ERR_ARG, "%s backward only supports 'sum' reduction, got '%s' (on rank %d)", name,
             ddp_reduce_op_name(c->op), ddp_pg_global_rank(c->pg, c->rank));
  return DDP_OK;
}

/* A new context for a node of group pg whose output is out. NULL with the error set. */
static coll_ctx *ctx_new(ddp_pg *pg, const ddp_tensor *out, const char *name) {
  coll_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    DDP_ERROR(DDP_ERR_MEMORY, "%s: out of memory recording the graph", name);
    return NULL;
  }
  c->pg = pg;
  c->rank = ddp_pg_rank(pg);
  c->world = ddp_pg_size(pg);
  c->out_ndim = out->ndim;
  c->out_dtype = out->dtype;
  c->out_device = out->device;
  memcpy(c->out_shape, out->shape, sizeof c->out_shape);
  snprintf(c->site, sizeof c->site, "%s", pg_call_site());
  return c;
}

/* Record node `name` (input in, output *out) with context c (taken over, also on failure).
 * A no-op (c freed) when in needs no gradient or is not floating. Releases *out on failure. */
static int record(ddp_tensor **out, ddp_tensor *in, const char *name, ddp_backward_fn bw,
                  coll_ctx *c) {
  if (!ddp_autograd_needed(1, &in) || !ddp_dtype_is_floating(in->dtype)) {
    ctx_free(c);
    return DDP_OK;
  }
  ddp_node *n = ddp_node_new(name, bw, 1, &in, 0);
  if (!n) {
    ctx_free(c);
    ddp_tensor_release(*out);
    *out = NULL;
    return ddp_last_status();
  }
  n->extra = c;
  n->extra_free = ctx_free;
  n->collective = 1; /* Note [collectives on the tape] */
  ddp_autograd_set_output(*out, n);
  return DDP_OK;
}

/* Finish a forward: on failure release *out and free c; else record the node. */
static int finish(int status, ddp_tensor **out, ddp_tensor *in, const char *name,
                  ddp_backward_fn bw, coll_ctx *c) {
  if (status) {
    ctx_free(c);
    ddp_tensor_release(*out);
    *out = NULL;
    return status;
  }
  return record(out, in, name, bw, c);
}

/* ---- backward helpers ------------------------------------------------------------------ */

/* The gradient a backward works on: a contiguous copy of grad_output (the collectives write
 * in place), or zeros of the output's shape when no gradient reached the output (Note
 * [collectives on the tape]). */
static int grad_copy(ddp_tensor **g, ddp_tensor *grad_output, const coll_ctx *c) {
  if (grad_output) return ddp_clone(g, grad_output);
  return ddp_tensor_zeros(g, c->out_ndim, c->out_shape, c->out_dtype, c->out_device);
}

/* Backward collectives name the forward's call site (Note [collective fingerprints]); the
 * thread's call site is put back afterwards. */
typedef struct {
  char saved[PG_SITE_CAP];
} site_guard;

static void site_enter(site_guard *s, const coll_ctx *c) {
  char text[PG_SITE_CAP];
  snprintf(s->saved, sizeof s->saved, "%s", pg_call_site());
  snprintf(text, sizeof text, "backward of %s", c->site[0] ? c->site : "a collective");
  ddp_pg_set_call_site(text, 0);
}

static void site_leave(const site_guard *s) {
  ddp_pg_set_call_site(s->saved[0] ? s->saved : NULL, 0);
}

/* ---- Note [rank-major layout] ------------------------------------------------------------ */

/* t (s0, .., world * k at dim d, .., sn) -> *out (world, s0, .., k, .., sn), contiguous. */
static int to_rank_major(ddp_tensor **out, ddp_tensor *t, int d, int world) {
  int64_t shape[DDP_MAX_DIMS + 1];
  int nd = t->ndim;
  if (d == 0) {
    ddp_tensor *c = NULL;
    DDP_TRY(ddp_contiguous(&c, t));
    shape[0] = world;
    shape[1] = t->shape[0] / world;
    memcpy(shape + 2, t->shape + 1, (size_t)(nd - 1) * sizeof *shape);
    int st = ddp_view(out, c, nd + 1, shape);
    ddp_tensor_release(c);
    return st;
  }
  for (int i = 0, j = 0; i < nd; i++) {
    if (i == d) {
      shape[j++] = world;
      shape[j++] = t->shape[i] / world;
    } else {
      shape[j++] = t->shape[i];
    }
  }
  int perm[DDP_MAX_DIMS + 1];
  perm[0] = d;
  for (int i = 0, j = 1; i <= nd; i++)
    if (i != d) perm[j++] = i;
  ddp_tensor *v = NULL, *p = NULL;
  int st = ddp_reshape(&v, t, nd + 1, shape);
  if (!st) st = ddp_permute(&p, v, nd + 1, perm);
  if (!st) st = ddp_clone(out, p);
  ddp_tensor_release(v);
  ddp_tensor_release(p);
  return st;
}

/* buf (world, s0, .., k at dim d + 1, .., sn), contiguous -> *out (s0, .., world * k, ..,
 * sn), contiguous. */
static int from_rank_major(ddp_tensor **out, ddp_tensor *buf, int d) {
  int64_t shape[DDP_MAX_DIMS];
  int nd = buf->ndim - 1, world = (int)buf->shape[0];
  for (int i = 0; i < nd; i++) shape[i] = buf->shape[i + 1];
  shape[d] *= world;
  if (d == 0) return ddp_view(out, buf, nd, shape);
  int perm[DDP_MAX_DIMS + 1];
  for (int i = 0, j = 1; i <= nd; i++) perm[i] = i == d ? 0 : j++;
  ddp_tensor *p = NULL, *c = NULL;
  int st = ddp_permute(&p, buf, nd + 1, perm);
  if (!st) st = ddp_clone(&c, p);
  if (!st) st = ddp_view(out, c, nd, shape);
  ddp_tensor_release(p);
  ddp_tensor_release(c);
  return st;
}

/* all_gather_tensor of t along d: (.., sd, ..) -> (.., world * sd, ..). */
static int gather_along(ddp_tensor **out, ddp_pg *pg, ddp_tensor *t, int d) {
  int world = ddp_pg_size(pg);
  int64_t shape[DDP_MAX_DIMS + 1];
  shape[0] = world;
  memcpy(shape + 1, t->shape, (size_t)t->ndim * sizeof *shape);
  ddp_tensor *c = NULL, *buf = NULL;
  int st = ddp_contiguous(&c, t);
  if (!st) st = ddp_tensor_empty(&buf, t->ndim + 1, shape, t->dtype, t->device);
  if (!st) st = ddp_pg_allgather_into_tensor(NULL, pg, buf, c);
  if (!st) st = from_rank_major(out, buf, d);
  ddp_tensor_release(c);
  ddp_tensor_release(buf);
  return st;
}

/* reduce_scatter_tensor of t along d with op: (.., world * k, ..) -> (.., k, ..). */
static int scatter_along(ddp_tensor **out, ddp_pg *pg, ddp_tensor *t, int d, int op) {
  int world = ddp_pg_size(pg);
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
  shape[d] /= world;
  ddp_tensor *rm = NULL;
  int st = to_rank_major(&rm, t, d, world);
  if (!st) st = ddp_tensor_empty(out, t->ndim, shape, t->dtype, t->device);
  if (!st) st = ddp_pg_reduce_scatter_tensor(NULL, pg, *out, rm, op);
  ddp_tensor_release(rm);
  if (st) {
    ddp_tensor_release(*out);
    *out = NULL;
  }
  return st;
}

/* ---- all_reduce --------------------------------------------------------------------- */

/* AllReduceBackward: the all-reduce (sum) of the gradient. */
static int all_reduce_backward(ddp_node *n, ddp_tensor *grad_output, ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  DDP_TRY(check_sum_backward(c, "all_reduce"));
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  site_guard s;
  site_enter(&s, c);
  int st = ddp_pg_allreduce(NULL, c->pg, g, DDP_REDUCE_SUM);
  site_leave(&s);
  if (st) {
    ddp_tensor_release(g);
    return st;
  }
  grad_inputs[0] = g;
  return DDP_OK;
}

int ddp_dist_fn_all_reduce(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int op) {
  DDP_TRY(check_args(out, pg, in, "all_reduce"));
  DDP_TRY(check_op(op, "all_reduce"));
  int st;
  NO_GRAD(st, ddp_clone(out, in));
  if (!st) st = ddp_pg_allreduce(NULL, pg, *out, op);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "all_reduce");
  if (!st && !c) st = ddp_last_status();
  if (c) c->op = op;
  return finish(st, out, in, "AllReduceBackward", all_reduce_backward, c);
}

/* ---- broadcast ---------------------------------------------------------------------- */

/* BroadcastBackward: the gradients summed on src; zeros on the other ranks. */
static int broadcast_backward(ddp_node *n, ddp_tensor *grad_output, ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  site_guard s;
  site_enter(&s, c);
  int st = ddp_pg_reduce(NULL, c->pg, g, c->root, DDP_REDUCE_SUM);
  site_leave(&s);
  if (!st && c->rank != c->root) st = ddp_zero_(g);
  if (st) {
    ddp_tensor_release(g);
    return st;
  }
  grad_inputs[0] = g;
  return DDP_OK;
}

int ddp_dist_fn_broadcast(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int src) {
  DDP_TRY(check_args(out, pg, in, "broadcast"));
  DDP_TRY(check_root(pg, src, "broadcast", "src"));
  int st;
  NO_GRAD(st, ddp_clone(out, in));
  if (!st) st = ddp_pg_broadcast(NULL, pg, *out, src);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "broadcast");
  if (!st && !c) st = ddp_last_status();
  if (c) c->root = src;
  return finish(st, out, in, "BroadcastBackward", broadcast_backward, c);
}

/* ---- reduce ------------------------------------------------------------------------- */

/* ReduceBackward: dst's gradient broadcast, plus the own gradient off dst. */
static int reduce_backward(ddp_node *n, ddp_tensor *grad_output, ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  DDP_TRY(check_sum_backward(c, "reduce"));
  ddp_tensor *g = NULL, *own = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  /* ranks other than dst: their output is their input, so its gradient adds in */
  int st = c->rank != c->root ? ddp_clone(&own, g) : DDP_OK;
  site_guard s;
  site_enter(&s, c);
  if (!st) st = ddp_pg_broadcast(NULL, c->pg, g, c->root);
  site_leave(&s);
  if (!st && own) st = ddp_add_(g, own);
  ddp_tensor_release(own);
  if (st) {
    ddp_tensor_release(g);
    return st;
  }
  grad_inputs[0] = g;
  return DDP_OK;
}

int ddp_dist_fn_reduce(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int dst, int op) {
  DDP_TRY(check_args(out, pg, in, "reduce"));
  DDP_TRY(check_root(pg, dst, "reduce", "dst"));
  DDP_TRY(check_op(op, "reduce"));
  int st;
  NO_GRAD(st, ddp_clone(out, in));
  if (!st) st = ddp_pg_reduce(NULL, pg, *out, dst, op);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "reduce");
  if (!st && !c) st = ddp_last_status();
  if (c) {
    c->root = dst;
    c->op = op;
  }
  return finish(st, out, in, "ReduceBackward", reduce_backward, c);
}

/* ---- all_gather_tensor / reduce_scatter_tensor -------------------------------------- */

/* AllGatherTensorBackward: reduce_scatter_tensor (sum) of the gradient along the dim. */
static int all_gather_tensor_backward(ddp_node *n, ddp_tensor *grad_output,
                                      ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  site_guard s;
  site_enter(&s, c);
  int st = scatter_along(&grad_inputs[0], c->pg, g, c->dim, DDP_REDUCE_SUM);
  site_leave(&s);
  ddp_tensor_release(g);
  return st;
}

int ddp_dist_fn_all_gather_tensor(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int gather_dim) {
  DDP_TRY(check_args(out, pg, in, "all_gather_tensor"));
  DDP_TRY(check_ndim(in, "all_gather_tensor"));
  int d;
  DDP_TRY(ddp_normalize_dim(gather_dim, in->ndim, "all_gather_tensor: gather_dim", &d));
  int st;
  NO_GRAD(st, gather_along(out, pg, in, d));
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "all_gather_tensor");
  if (!st && !c) st = ddp_last_status();
  if (c) c->dim = d;
  return finish(st, out, in, "AllGatherTensorBackward", all_gather_tensor_backward, c);
}

/* ReduceScatterTensorBackward: all_gather_tensor of the gradient along the dim. */
static int reduce_scatter_tensor_backward(ddp_node *n, ddp_tensor *grad_output,
                                          ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  DDP_TRY(check_sum_backward(c, "reduce_scatter_tensor"));
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  site_guard s;
  site_enter(&s, c);
  int st = gather_along(&grad_inputs[0], c->pg, g, c->dim);
  site_leave(&s);
  ddp_tensor_release(g);
  return st;
}

int ddp_dist_fn_reduce_scatter_tensor(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in,
                                      int scatter_dim, int op) {
  DDP_TRY(check_args(out, pg, in, "reduce_scatter_tensor"));
  DDP_TRY(check_op(op, "reduce_scatter_tensor"));
  DDP_TRY(check_ndim(in, "reduce_scatter_tensor"));
  int d;
  DDP_TRY(ddp_normalize_dim(scatter_dim, in->ndim, "reduce_scatter_tensor: scatter_dim", &d));
  int world = ddp_pg_size(pg);
  if (in->shape[d] % world)
    DDP_FAIL(DDP_ERR_ARG, "reduce_scatter_tensor: input dimension %d (size %lld) must be a "
             "multiple of the group size %d (input of shape %s)", d + 1,
             (long long)in->shape[d], world, DDP_SHAPE(in));
  int st;
  NO_GRAD(st, scatter_along(out, pg, in, d, op));
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "reduce_scatter_tensor");
  if (!st && !c) st = ddp_last_status();
  if (c) {
    c->dim = d;
    c->op = op;
  }
  return finish(st, out, in, "ReduceScatterTensorBackward", reduce_scatter_tensor_backward, c);
}

/* ---- all_to_all_single -------------------------------------------------------------- */

/* AllToAllSingleBackward: the exchange of the gradient with the split sizes swapped. */
static int all_to_all_single_backward(ddp_node *n, ddp_tensor *grad_output,
                                      ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  const ddp_input_meta *m = &n->inputs[0];
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  int st = ddp_tensor_empty(&grad_inputs[0], m->ndim, m->shape, c->out_dtype, c->out_device);
  site_guard s;
  site_enter(&s, c);
  /* the inverse exchange: what came from rank i goes back to it */
  if (!st)
    st = ddp_pg_alltoall_single(NULL, c->pg, grad_inputs[0], g, c->in_splits,
                                c->in_splits ? c->world : 0, c->out_splits,
                                c->out_splits ? c->world : 0);
  site_leave(&s);
  ddp_tensor_release(g);
  if (st) {
    ddp_tensor_release(grad_inputs[0]);
    grad_inputs[0] = NULL;
  }
  return st;
}

/* A copy of split list v (n entries; NULL: even) for the context; *ok 0 on memory failure. */
static int64_t *copy_splits(const int64_t *v, int n, int *ok) {
  if (!v) return NULL;
  int64_t *c = malloc((size_t)n * sizeof *c);
  if (!c) {
    *ok = 0;
    return NULL;
  }
  memcpy(c, v, (size_t)n * sizeof *c);
  return c;
}

/* Check a split list against the group (the collective checks them against the tensors). */
static int check_splits(const int64_t *v, int n, int world, const char *what, int64_t *sum) {
  *sum = 0;
  if (!v) return DDP_OK;
  if (n != world)
    DDP_FAIL(DDP_ERR_ARG, "all_to_all_single: %s has %d entries but the group has %d ranks", what,
             n, world);
  for (int i = 0; i < n; i++) {
    if (v[i] < 0)
      DDP_FAIL(DDP_ERR_ARG, "all_to_all_single: %s entry %d is negative (%lld)", what, i + 1,
               (long long)v[i]);
    *sum += v[i];
  }
  return DDP_OK;
}

int ddp_dist_fn_all_to_all_single(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in,
                                  const int64_t *output_split_sizes, int n_output_splits,
                                  const int64_t *input_split_sizes, int n_input_splits) {
  DDP_TRY(check_args(out, pg, in, "all_to_all_single"));
  if (in->ndim == 0)
    DDP_FAIL(DDP_ERR_ARG, "all_to_all_single: input must have at least one dimension (a 0-d "
             "tensor was given)");
  int world = ddp_pg_size(pg);
  int64_t rows_out, rows_in;
  DDP_TRY(check_splits(output_split_sizes, n_output_splits, world, "output_split_sizes", &rows_out));
  DDP_TRY(check_splits(input_split_sizes, n_input_splits, world, "input_split_sizes", &rows_in));
  int64_t shape[DDP_MAX_DIMS];
  memcpy(shape, in->shape, sizeof shape);
  if (output_split_sizes) shape[0] = rows_out;
  ddp_tensor *c_in = NULL;
  int st;
  NO_GRAD(st, ddp_contiguous(&c_in, in));
  if (!st) st = ddp_tensor_empty(out, in->ndim, shape, in->dtype, in->device);
  if (!st)
    st = ddp_pg_alltoall_single(NULL, pg, *out, c_in, output_split_sizes, n_output_splits,
                                input_split_sizes, n_input_splits);
  ddp_tensor_release(c_in);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "all_to_all_single");
  if (!st && !c) st = ddp_last_status();
  if (c) {
    int ok = 1;
    c->out_splits = copy_splits(output_split_sizes, world, &ok);
    c->in_splits = copy_splits(input_split_sizes, world, &ok);
    if (!ok) st = DDP_ERROR(DDP_ERR_MEMORY, "all_to_all_single: out of memory recording the graph");
  }
  return finish(st, out, in, "AllToAllSingleBackward", all_to_all_single_backward, c);
}

/* ---- gather / scatter --------------------------------------------------------------- */

/* GatherBackward: dst's (world, ...) gradient scattered back to the ranks. */
static int gather_backward(ddp_node *n, ddp_tensor *grad_output, ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  const ddp_input_meta *m = &n->inputs[0];
  ddp_tensor *g = NULL;
  /* only dst's gradient is read: the other ranks' rows are constants */
  DDP_TRY(grad_copy(&g, grad_output, c));
  int st = ddp_tensor_empty(&grad_inputs[0], m->ndim, m->shape, c->out_dtype, c->out_device);
  site_guard s;
  site_enter(&s, c);
  if (!st) st = ddp_pg_scatter(NULL, c->pg, grad_inputs[0], c->rank == c->root ? g : NULL, c->root);
  site_leave(&s);
  ddp_tensor_release(g);
  if (st) {
    ddp_tensor_release(grad_inputs[0]);
    grad_inputs[0] = NULL;
  }
  return st;
}

int ddp_dist_fn_gather(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int dst) {
  DDP_TRY(check_args(out, pg, in, "gather"));
  DDP_TRY(check_root(pg, dst, "gather", "dst"));
  if (in->ndim >= DDP_MAX_DIMS)
    DDP_FAIL(DDP_ERR_ARG, "gather: input has %d dimensions (at most %d: the output adds one)",
             in->ndim, DDP_MAX_DIMS - 1);
  int64_t shape[DDP_MAX_DIMS];
  shape[0] = ddp_pg_size(pg);
  memcpy(shape + 1, in->shape, (size_t)in->ndim * sizeof *shape);
  ddp_tensor *c_in = NULL;
  int st;
  NO_GRAD(st, ddp_contiguous(&c_in, in));
  if (!st) st = ddp_tensor_zeros(out, in->ndim + 1, shape, in->dtype, in->device);
  if (!st) st = ddp_pg_gather(NULL, pg, ddp_pg_rank(pg) == dst ? *out : NULL, c_in, dst);
  ddp_tensor_release(c_in);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "gather");
  if (!st && !c) st = ddp_last_status();
  if (c) c->root = dst;
  return finish(st, out, in, "GatherBackward", gather_backward, c);
}

/* ScatterBackward: the ranks' gradients gathered on src as (world, ...); zeros elsewhere. */
static int scatter_backward(ddp_node *n, ddp_tensor *grad_output, ddp_tensor **grad_inputs) {
  coll_ctx *c = n->extra;
  const ddp_input_meta *m = &n->inputs[0];
  ddp_tensor *g = NULL;
  DDP_TRY(grad_copy(&g, grad_output, c));
  int st = ddp_tensor_zeros(&grad_inputs[0], m->ndim, m->shape, c->out_dtype, c->out_device);
  site_guard s;
  site_enter(&s, c);
  if (!st) st = ddp_pg_gather(NULL, c->pg, c->rank == c->root ? grad_inputs[0] : NULL, g, c->root);
  site_leave(&s);
  ddp_tensor_release(g);
  if (st) {
    ddp_tensor_release(grad_inputs[0]);
    grad_inputs[0] = NULL;
  }
  return st;
}

int ddp_dist_fn_scatter(ddp_tensor **out, ddp_pg *pg, ddp_tensor *in, int src) {
  DDP_TRY(check_args(out, pg, in, "scatter"));
  DDP_TRY(check_root(pg, src, "scatter", "src"));
  int world = ddp_pg_size(pg);
  if (in->ndim == 0 || in->shape[0] != world)
    DDP_FAIL(DDP_ERR_ARG, "scatter: input must have shape (%d, ...) (one row per rank of the "
             "group), got %s", world, DDP_SHAPE(in));
  ddp_tensor *c_in = NULL;
  int st;
  NO_GRAD(st, ddp_contiguous(&c_in, in));
  if (!st) st = ddp_tensor_empty(out, in->ndim - 1, in->shape + 1, in->dtype, in->device);
  if (!st) st = ddp_pg_scatter(NULL, pg, *out, ddp_pg_rank(pg) == src ? c_in : NULL, src);
  ddp_tensor_release(c_in);
  coll_ctx *c = st ? NULL : ctx_new(pg, *out, "scatter");
  if (!st && !c) st = ddp_last_status();
  if (c) c->root = src;
  return finish(st, out, in, "ScatterBackward", scatter_backward, c);
}
