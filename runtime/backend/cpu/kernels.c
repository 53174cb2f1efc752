/* runtime/backend/cpu/kernels.c: the CPU kernel table (runtime/backend/kernels.h). Each entry
 * is the area file's ddp_cpu_<name>, which picks its typed loop from the dtype
 * (Note [one dispatch path]). */
#include "backend/kernels.h"

#include "backend/cpu/attention.h"
#include "backend/cpu/collective.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/copy.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm_parallel.h"
#include "backend/cpu/loss.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/norm.h"
#include "backend/cpu/optim.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/reduce.h"
#include "backend/cpu/shape.h"

const ddp_kernels ddp_cpu_kernels = {
    .name = "cpu",
    .copy = ddp_cpu_copy,
    .fill = ddp_cpu_fill,
    .binary = ddp_cpu_binary,
    .binary_backward = ddp_cpu_binary_backward,
    .unary = ddp_cpu_unary,
    .unary_backward = ddp_cpu_unary_backward,
    .where = ddp_cpu_where,
    .sum = ddp_cpu_sum,
    .var = ddp_cpu_var,
    .argext = ddp_cpu_argext,
    .softmax = ddp_cpu_softmax,
    .softmax_backward = ddp_cpu_softmax_backward,
    .gemm = ddp_cpu_gemm_parallel,
    .matmul_int = ddp_cpu_matmul_int,
    .gemm_threads_hold = ddp_cpu_blas_hold_single,
    .gemm_threads_restore = ddp_cpu_blas_restore,
    .conv2d_forward = ddp_cpu_conv2d_forward,
    .conv2d_backward = ddp_cpu_conv2d_backward,
    .max_pool2d_forward = ddp_cpu_max_pool2d_forward,
    .max_pool2d_backward = ddp_cpu_max_pool2d_backward,
    .relu_max_pool2d_taps = ddp_cpu_relu_max_pool2d_taps,
    .relu_max_pool2d_forward = ddp_cpu_relu_max_pool2d_forward,
    .relu_max_pool2d_backward = ddp_cpu_relu_max_pool2d_backward,
    .avg_pool2d_forward = ddp_cpu_avg_pool2d_forward,
    .avg_pool2d_backward = ddp_cpu_avg_pool2d_backward,
    .adaptive_avg_pool2d_forward = ddp_cpu_adaptive_avg_pool2d_forward,
    .adaptive_avg_pool2d_backward = ddp_cpu_adaptive_avg_pool2d_backward,
    .cross_entropy_forward = ddp_cpu_cross_entropy_forward,
    .cross_entropy_backward = ddp_cpu_cross_entropy_backward,
    .nll_forward = ddp_cpu_nll_forward,
    .nll_backward = ddp_cpu_nll_backward,
    .mse_forward = ddp_cpu_mse_forward,
    .mse_backward = ddp_cpu_mse_backward,
    .bn_moments = ddp_cpu_bn_moments,
    .bn_sums = ddp_cpu_bn_sums,
    .bn_apply = ddp_cpu_bn_apply,
    .bn_backward_reduce = ddp_cpu_bn_backward_reduce,
    .bn_backward_elemt = ddp_cpu_bn_backward_elemt,
    .bn_apply_relu = ddp_cpu_bn_apply_relu,
    .bn_backward_reduce_relu = ddp_cpu_bn_backward_reduce_relu,
    .bn_backward_elemt_relu = ddp_cpu_bn_backward_elemt_relu,
    .bn_finalize = ddp_cpu_bn_finalize,
    .bn_running_update = ddp_cpu_bn_running_update,
    .bn_backward_coef = ddp_cpu_bn_backward_coef,
    .ln_forward = ddp_cpu_ln_forward,
    .ln_backward = ddp_cpu_ln_backward,
    .masked_scale = ddp_cpu_masked_scale,
    .embedding_forward = ddp_cpu_embedding_forward,
    .embedding_backward = ddp_cpu_embedding_backward,
    .attention_forward = ddp_cpu_attention_forward,
    .attention_backward = ddp_cpu_attention_backward,
    .sgd = ddp_cpu_sgd,
    .sgd_multi = ddp_cpu_sgd_multi,
    .adam = ddp_cpu_adam,
    .adadelta = ddp_cpu_adadelta,
    .abs_pow_sum = ddp_cpu_abs_pow_sum,
    .abs_max = ddp_cpu_abs_max,
    .scale = ddp_cpu_scale,
    .clamp = ddp_cpu_clamp,
    .non_finite_check_and_unscale = ddp_cpu_non_finite_check_and_unscale,
    .copy_rows = ddp_cpu_copy_rows,
    .index_select = ddp_cpu_index_select,
    .index_add = ddp_cpu_index_add,
    .gather = ddp_cpu_gather,
    .scatter_add = ddp_cpu_scatter_add,
    .reduce_inputs = ddp_cpu_reduce_inputs,
    .reduce_inputs_all = ddp_cpu_reduce_inputs_all,
    .scale_into = ddp_cpu_scale_into,
    .cast_scale = ddp_cpu_cast_scale,
};
