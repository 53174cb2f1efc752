/* ddplua/ops_attention.h: part of the public API, included by ddplua.h only. */

/* torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x semantics) as one fused,
 * differentiable op:
 *
 *   out = dropout(softmax(query keyᵀ * scale + mask)) value
 *
 *   query:     (..., L, E)   floating (f32, f64; f16 and bf16 are computed in f32 and the
 *                            result rounded once)
 *   key:       (..., S, E)   query's dtype and batch dims (...)
 *   value:     (..., S, Ev)  likewise
 *   attn_mask: NULL, or broadcastable to (..., L, S): bool (true = the pair takes part,
 *              false = -inf) or query's dtype (added to the scaled scores; differentiable)
 *   dropout_p: probability in [0, 1) of zeroing an attention weight (kept ones are scaled
 *              by 1 / (1 - dropout_p)); drawn from gen (NULL: the default generator) by a
 *              counter-based rule (Note [attention dropout], runtime/backend/cpu/attention.h)
 *              that backward replays from the saved seed and offset: no mask is stored
 *   is_causal: 1: key j takes no part in query i's row when j > i (top-left aligned, as
 *              PyTorch); not together with attn_mask
 *   scale:     NaN for the default 1 / sqrt(E)
 *   out:       (..., L, Ev)  query's dtype
 *
 * q, k and v are read in place when their rows are contiguous (the (N, T, H, hd)
 * transposed head views of a model, expanded batch dims): no copies; other layouts and
 * dtypes are copied first. The kernel never holds a whole (L, S) score matrix: it tiles the keys with an online
 * softmax and recomputes the tile's probabilities in backward from the saved row
 * logsumexp (Note [flash attention], runtime/backend/cpu/attention.c), so its memory grows
 * linearly in L and S. A row whose every key is masked gives NaN (as the explicit formula).
 * Gradients to query, key, value and a floating attn_mask (summed over its broadcast
 * dims; a mask that requires grad costs one (..., L, S) buffer in backward, the only
 * quadratic one). Not on the autocast list: it runs in its inputs' dtype (under autocast
 * q, k and v coming from linear layers are already in the lower precision). Errors (DDP_ERR_ARG, naming scaled_dot_product_attention and the argument):
 * ranks, batch dims, E or S that do not match (shapes named), dtypes that differ, a mask
 * that does not broadcast, a mask with is_causal, dropout_p outside [0, 1), tensors on
 * different devices. */
int ddp_scaled_dot_product_attention(ddp_tensor **out, ddp_tensor *query, ddp_tensor *key,
                                     ddp_tensor *value, ddp_tensor *attn_mask, double dropout_p,
                                     int is_causal, double scale, ddp_generator *gen);
