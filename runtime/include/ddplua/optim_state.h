/* ddplua/optim_state.h: part of the public API, included by ddplua.h only.
 *
 * The optimizer-state store and the per-parameter optimizer step over it
 * (runtime/ops/optim_state.c).
 *
 * Note [optimizer state store]: one C store keeps the state of every optimizer: the Lua
 * optimizers' opt.state (a view over it, ddplua.optim.state), ZeroRedundancyOptimizer's
 * local optimizer (a Lua optimizer), and the optimizer in backward of the DDP reducer
 * (ddplua/reducer_fused_optim.h). So one step function (ddp_optim_step_param) updates all
 * of them, and one state_dict code (Optimizer:state_dict in Lua) reads all of them.
 *  - An entry per parameter, keyed by the parameter's tensor object (ddp_tensor *: every Lua
 *    handle of one tensor is the same object). The store holds a reference to the parameter
 *    while its entry exists, so a freed parameter's address can never be reused by another
 *    tensor and alias its state; the reference goes with the entry (clear, free).
 *  - An entry holds named values, in the order they were first set: tensors
 *    ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg",
 *    "acc_delta", or any other name; the store holds a reference to each), numbers ("step")
 *    and booleans. Names are 1 to DDP_OPTIM_STATE_NAME_MAX bytes; setting a name replaces
 *    its value whatever its kind.
 *  - An entry may be empty (SGD without momentum: PyTorch's SGD has state for a parameter
 *    once stepped, with no tensor in it); "has an entry" is what a state_dict lists.
 *  - Entries are kept in the order they were created (what iteration gives; clearing an
 *    entry moves the last one into its place). Lookups are hashed: O(1) per parameter.
 *  - Not thread-safe: one thread uses a store at a time (the reducer's store is used by
 *    the thread running backward, and read between iterations).
 */

typedef struct ddp_optim_state ddp_optim_state;

/* What a name of an entry holds. */
enum ddp_optim_state_kind {
  DDP_OPTIM_STATE_NONE = 0,    /* no such name (or no such entry) */
  DDP_OPTIM_STATE_TENSOR = 1,
  DDP_OPTIM_STATE_NUMBER = 2,
  DDP_OPTIM_STATE_BOOLEAN = 3
};

enum { DDP_OPTIM_STATE_NAME_MAX = 63 };

/* *out = a new empty store (free it with ddp_optim_state_free). Errors: DDP_ERR_ARG (out
 * NULL), DDP_ERR_MEMORY. */
int ddp_optim_state_new(ddp_optim_state **out);

/* Release every entry (its parameter and tensors) and the store. NULL is a no-op. */
void ddp_optim_state_free(ddp_optim_state *s);

/* The number of entries (parameters with state); 0 for NULL. */
int64_t ddp_optim_state_count(const ddp_optim_state *s);

/* 1 when param has an entry, else 0 (also for NULL arguments). */
int ddp_optim_state_has(const ddp_optim_state *s, const ddp_tensor *param);

/* Create an empty entry for param (nothing when it has one). Errors: DDP_ERR_ARG (NULL
 * arguments, a freed param), DDP_ERR_MEMORY. */
int ddp_optim_state_add(ddp_optim_state *s, ddp_tensor *param);

/* *out = a new reference to the parameter of entry i (0 <= i < count, creation order;
 * release it). Errors: DDP_ERR_ARG (NULL arguments, i out of range, naming the count). */
int ddp_optim_state_param_at(const ddp_optim_state *s, int64_t i, ddp_tensor **out);

/* *n = the number of names in param's entry (0 when it has none). Errors: DDP_ERR_ARG (NULL
 * arguments). */
int ddp_optim_state_name_count(const ddp_optim_state *s, const ddp_tensor *param, int *n);

/* *name = the j-th name of param's entry (0 <= j < name_count; a string owned by the store,
 * valid until that name is removed or the entry cleared) and *kind its enum
 * ddp_optim_state_kind (kind may be NULL). Errors: DDP_ERR_ARG (NULL arguments, no entry
 * for param, j out of range). */
int ddp_optim_state_name_at(const ddp_optim_state *s, const ddp_tensor *param, int j,
                            const char **name, int *kind);

/* What name of param's entry holds (enum ddp_optim_state_kind; DDP_OPTIM_STATE_NONE when
 * param has no entry, no such name, or an argument is NULL). */
int ddp_optim_state_kind(const ddp_optim_state *s, const ddp_tensor *param, const char *name);

/* *out = a new reference to tensor `name` of param's entry (release it), or NULL when the
 * entry or the name does not exist. Errors: DDP_ERR_ARG (NULL arguments; the name holds a
 * number or a boolean, naming it). */
int ddp_optim_state_get_tensor(const ddp_optim_state *s, const ddp_tensor *param,
                               const char *name, ddp_tensor **out);

/* Set tensor `name` of param's entry (created when missing) to t, holding a reference to
 * it: the store and the caller then share the tensor (an in-place change by either is
 * seen by the other). t NULL removes the name (the entry stays). t may have any shape,
 * dtype and device: the step functions check them against the parameter. Errors:
 * DDP_ERR_ARG (NULL s, param or name; a freed param or t; a name that is empty or longer
 * than DDP_OPTIM_STATE_NAME_MAX bytes; t shares its storage with param), DDP_ERR_MEMORY. */
int ddp_optim_state_set_tensor(ddp_optim_state *s, ddp_tensor *param, const char *name,
                               ddp_tensor *t);

/* *out = number (or boolean, as 0 / 1) `name` of param's entry. Errors: DDP_ERR_ARG (NULL
 * arguments; no entry for param; no such name; the name holds a tensor), each naming the
 * name. */
int ddp_optim_state_get_number(const ddp_optim_state *s, const ddp_tensor *param,
                               const char *name, double *out);

/* Set number `name` of param's entry (created when missing) to v. Errors as
 * ddp_optim_state_set_tensor. */
int ddp_optim_state_set_number(ddp_optim_state *s, ddp_tensor *param, const char *name,
                               double v);

/* Set boolean `name` of param's entry (created when missing) to v != 0. Errors as
 * ddp_optim_state_set_tensor. */
int ddp_optim_state_set_boolean(ddp_optim_state *s, ddp_tensor *param, const char *name,
                                int v);

/* Remove name from param's entry (its tensor released); nothing when absent. Errors:
 * DDP_ERR_ARG (NULL arguments). */
int ddp_optim_state_remove(ddp_optim_state *s, const ddp_tensor *param, const char *name);

/* Remove param's entry (its values and its reference to param released); nothing when it
 * has none. Errors: DDP_ERR_ARG (NULL arguments). */
int ddp_optim_state_clear_entry(ddp_optim_state *s, const ddp_tensor *param);

/* Remove every entry. NULL is a no-op. */
void ddp_optim_state_clear(ddp_optim_state *s);

/* Make dst's entry for param a copy of src's (the same values; tensors shared, not
 * copied), replacing what dst had; when src has no entry, dst's is removed. Errors:
 * DDP_ERR_ARG (NULL arguments), DDP_ERR_MEMORY (dst's entry is then removed). */
int ddp_optim_state_copy_entry(ddp_optim_state *dst, const ddp_optim_state *src,
                               ddp_tensor *param);

/* ---- the step over the store --------------------------------------------------------- */

/* Which update ddp_optim_step_param runs. */
enum ddp_optim_kind {
  DDP_OPTIM_SGD = 1,       /* ddp_sgd_step_: lr, momentum, dampening, weight_decay, nesterov, maximize */
  DDP_OPTIM_ADAM = 2,      /* ddp_adam_step_: lr, beta1, beta2, eps, weight_decay, amsgrad, maximize */
  DDP_OPTIM_ADAMW = 3,     /* ddp_adamw_step_: the same, weight decay decoupled */
  DDP_OPTIM_ADADELTA = 4   /* ddp_adadelta_step_: lr, rho, eps, weight_decay, maximize */
};

/* Hyper-parameters (those a kind does not use are ignored), with ddplua/optim.h's meaning.
 * foreach (SGD, ddp_optim_step_params only): != 0 steps the parameters of the call in one
 * ddp_sgd_step_foreach_ (bit for bit the same result as one by one). */
typedef struct ddp_optim_config {
  int kind;                /* enum ddp_optim_kind */
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
  double beta1, beta2, eps;
  int amsgrad;
  double rho;
  int foreach;
} ddp_optim_config;

/* One update of param with gradient grad (param's shape, dtype and device) by the kernel of
 * cfg->kind, reading and writing param's entry of s, whose missing state is created first
 * as PyTorch's optimizers create it (zeros of param's shape, dtype and device):
 *  - SGD: the entry (empty when momentum == 0); with momentum != 0, "momentum_buffer",
 *    created on the first step holding that step's gradient (first_step of ddp_sgd_step_).
 *  - Adam / AdamW: when the entry has no "step", "step" = 0, "exp_avg" and "exp_avg_sq"
 *    zeros; with amsgrad, "max_exp_avg_sq" zeros when missing. The kernel runs at step + 1,
 *    stored back when it succeeded.
 *  - Adadelta: when the entry has no "step", "step" = 0, "square_avg" and "acc_delta"
 *    zeros; "step" incremented after the update.
 * Errors: DDP_ERR_ARG (NULL arguments; an unknown kind; what the kernel refuses: a state
 * tensor of another shape, dtype or device than param, naming it; a bad hyper-parameter;
 * a "step" that is not a count >= 0), DDP_ERR_MEMORY. */
int ddp_optim_step_param(ddp_optim_state *s, const ddp_optim_config *cfg, ddp_tensor *param,
                         ddp_tensor *grad);

/* The update of every params[i] (0 <= i < n) that has a gradient (ddp_tensor_grad; those
 * without are skipped and get no state, as PyTorch's step skips a None .grad), each as
 * ddp_optim_step_param with that gradient. SGD with cfg->foreach != 0: one
 * ddp_sgd_step_foreach_ over them all (every argument checked before any parameter
 * changes). Errors: as ddp_optim_step_param, naming the parameter's index i; DDP_ERR_ARG
 * (n < 0, params NULL with n > 0, a NULL params[i]). */
int ddp_optim_step_params(ddp_optim_state *s, const ddp_optim_config *cfg, int64_t n,
                          ddp_tensor *const *params);
