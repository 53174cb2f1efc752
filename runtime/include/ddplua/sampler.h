/* ddplua/sampler.h: part of the public API, included by ddplua.h only.
 *
 * DistributedSampler: which dataset indices each rank reads in an epoch. The rules are
 * PyTorch's torch.utils.data.distributed.DistributedSampler (v2.x), with one exception:
 * the shuffled permutation comes from ddplua's Philox generator (ddp_randperm seeded with
 * seed + epoch), not from PyTorch's mt19937, so the ORDER after shuffling differs from
 * PyTorch's; the sizes, the padding, drop_last and the rank stride are identical.
 *
 * Note [sampler rules] (n samples, world ranks, this rank r, 0 <= r < world):
 *  1. base = a permutation of 0 .. n-1 drawn from a fresh generator seeded with
 *     seed + epoch (the same on every rank), or 0 .. n-1 when not shuffling.
 *  2. pad (default, drop_last = 0): num_samples = ceil(n / world), total_size =
 *     num_samples * world; the list is extended to total_size by repeating it from the
 *     front (the whole list again and again when n < world): element i is base[i % n].
 *     drop_last = 1: num_samples = floor(n / world) (PyTorch writes it
 *     ceil((n - world) / world) when n % world != 0), the list is truncated to total_size.
 *  3. rank r takes elements r, r + world, r + 2 world, ... < total_size (indices[r::world]).
 * Evaluation mode (pad = 0, drop_last = 0): no padding and no truncation; rank r takes
 * elements r, r + world, ... < n, so every sample is seen exactly once across ranks and
 * ranks may get different counts (ceil((n - r) / world) each; 0 when r >= n). Gather or
 * all-reduce SUMS of per-sample metrics, not per-rank means, in that mode. */

/* Number of indices rank `rank` gets (Note [sampler rules]). DDP_ERR_ARG when n < 0,
 * world < 1, rank outside [0, world), or pad = 0 together with drop_last = 1 (drop_last
 * already pads nothing; ask for one of them). */
int ddp_dist_sampler_len(int64_t *out, int64_t n, int64_t world, int64_t rank, int drop_last,
                         int pad);

/* The indices (0-based dataset positions) rank `rank` reads in epoch `epoch`, as a new 1-d
 * i64 tensor of ddp_dist_sampler_len elements (Note [sampler rules]). shuffle != 0 draws
 * the permutation from a generator seeded with (uint64)(seed + epoch); the result depends
 * on nothing else (not on the default generator, not on thread count). Errors as
 * ddp_dist_sampler_len; DDP_ERR_MEMORY. */
int ddp_dist_sampler_indices(ddp_tensor **out, int64_t n, int64_t world, int64_t rank,
                             int shuffle, int64_t seed, int64_t epoch, int drop_last, int pad);
