/* ddplua/io.h: part of the public API, included by ddplua.h only.
 *
 * Data input and checkpoints (runtime/io/): dataset file readers (IDX, CIFAR-10 binary,
 * token files), batch collation with the usual image transforms, a batch loader with a
 * prefetch thread, safetensors checkpoint files, and TensorBoard event files (written
 * only). Every reader names the file and the fault in its error (DDP_ERR_IO) and never
 * crashes on malformed input.
 */

/* ---------------------------------------------------------------------------------------
 * Dataset files (runtime/io/idx.c, runtime/io/cifar.c)
 * ------------------------------------------------------------------------------------- */

/* Read an IDX file (the MNIST / Fashion-MNIST format, http://yann.lecun.com/exdb/mnist/),
 * gzipped or raw (zlib detects which), into a new contiguous tensor of the file's shape.
 * Layout: two zero bytes, a type code, the number of dimensions, one big-endian u32 size per
 * dimension, then the data in row-major order, big-endian.
 * Type codes and result dtypes: 0x08 u8 -> u8; 0x09 i8 -> i32; 0x0B i16 -> i32;
 * 0x0C i32 -> i32; 0x0D f32 -> f32; 0x0E f64 -> f64.
 * Errors (DDP_ERR_IO, the message names the file): cannot open (with strerror), corrupt gzip
 * stream, wrong magic (the bytes found), unknown type code, 0 or more than 8 dimensions,
 * sizes whose product overflows or passes 2^33 bytes, truncated data ("expected N bytes
 * of data, found M"), trailing bytes after the data. */
int ddp_io_read_idx(ddp_tensor **out, const char *path);

/* The same reader over a whole IDX file already in memory (size bytes at data): gzipped
 * when it starts with the gzip magic 1f 8b (inflated with zlib), else raw. The same checks
 * and errors as ddp_io_read_idx, the messages naming `name` (NULL: "<bytes>") for the file;
 * DDP_ERR_ARG for NULL data with a non-zero size or more than 4 GiB of gzipped bytes. */
int ddp_io_read_idx_bytes(ddp_tensor **out, const void *data, size_t size, const char *name);

/* Read CIFAR-10 binary batch files (https://www.cs.toronto.edu/~kriz/cifar.html): records of
 * 1 label byte then 3072 image bytes (3 x 32 x 32, channel-major: the red plane, then
 * green, then blue, each row-major), the files' records concatenated in order.
 * images: (N, 3, 32, 32) u8; labels: (N) i64 in 0..9. npaths >= 1.
 * Errors (DDP_ERR_IO): a file that cannot be opened or read, a file whose size is not a
 * positive multiple of 3073 (naming the file and its size), a label above 9 (naming the
 * file, the record (0-based) and the value). */
int ddp_io_read_cifar(ddp_tensor **images, ddp_tensor **labels, int npaths,
                      const char *const *paths);

/* One CIFAR-10 binary batch already in memory (size bytes at data): the same records,
 * results, checks and errors as ddp_io_read_cifar, the messages naming `name` (NULL:
 * "<bytes>") for the file; DDP_ERR_ARG for NULL data with a non-zero size. */
int ddp_io_read_cifar_bytes(ddp_tensor **images, ddp_tensor **labels, const void *data,
                            size_t size, const char *name);

/* A view of the contiguous tensor t with another shape of the same number of elements
 * (sharing storage, no autograd): how the dataset code turns (N, 28, 28) into
 * (N, 1, 28, 28) without the shape ops. Errors: t not contiguous, numel differs, ndim out
 * of 0..8. */
int ddp_io_reshape(ddp_tensor **out, ddp_tensor *t, int ndim, const int64_t *shape);

/* ---------------------------------------------------------------------------------------
 * Batch collation and transforms (runtime/io/batch.c)
 *
 * A sample of a source tensor (N, ...) is src[i]. Image transforms see a sample as
 * (C, H, W): its last two dimensions are H and W, and every dimension before them together
 * is C (a (H, W) sample has C = 1). A zero-filled ddp_io_transform is the identity.
 *
 * Order of work for each sample (torchvision's CIFAR pipeline RandomCrop, RandomFlip,
 * ToTensor, Normalize): crop a crop_h x crop_w window from the sample padded with
 * `padding` on every side, flip it left-right, then scale (to_float), then normalize:
 *   out[c, y, x] = (in[c, sy, sx] * scale - mean[c]) / std[c]
 * with sy = y + oy - padding, sx = (flip ? crop_w - 1 - x : x) + ox - padding. A position
 * outside the sample reads 0 before scaling (pad_mode DDP_IO_PAD_INPUT: as torchvision pads
 * the raw image) or gives 0 in the output (DDP_IO_PAD_OUTPUT: a crop after Normalize).
 *
 * Randomness (Note [transform randomness]): the sample at position p of a batch or epoch
 * uses Philox block (seed, offset + p) of the generator (as ddplua.h's fills): word 0 gives
 * the flip (flip when w0 / 2^32 < flip_p), word 1 the crop row oy = w1 mod (H + 2 padding -
 * crop_h + 1), word 2 the crop column ox likewise. Every source of a batch uses the same
 * block for the same sample, so an image and its mask get the same crop and flip. Results
 * do not depend on threads or prefetching, only on the generator state.
 * ------------------------------------------------------------------------------------- */

enum ddp_io_pad_mode {
  DDP_IO_PAD_INPUT = 0,  /* padding reads raw 0, then goes through scale and normalize */
  DDP_IO_PAD_OUTPUT = 1  /* padding is 0 in the output */
};

typedef struct ddp_io_transform {
  int to_float;      /* 1: the output is f32, each value multiplied by `scale` (ToFloat) */
  double scale;      /* ToFloat's factor, 1/255 for u8 images (0 is read as 1) */
  int normalize;     /* 1: (x - mean[c]) / std[c]; the output is f32 */
  int nchannels;     /* entries used in mean and std: 1 (shared by every channel) or C */
  double mean[16];   /* per channel */
  double std[16];    /* per channel, non-zero */
  int crop_h;        /* crop window height; 0: no crop */
  int crop_w;        /* crop window width; 0: no crop */
  int padding;       /* zeros added on every side before cropping (>= 0) */
  int pad_mode;      /* enum ddp_io_pad_mode */
  double flip_p;     /* probability of a left-right flip, 0 .. 1 */
} ddp_io_transform;

/* Gather samples of src (N, ...) (any dtype, any strides) at the 0-based `indices` (i64 or
 * i32; shape (B) gives out (B, ...), a 0-d index gives one sample (...)) into one new
 * contiguous tensor, applying `tf` (NULL: none). The dtype of out is f32 when tf->to_float
 * or tf->normalize, else src's. Cropping changes the last two sizes to (crop_h, crop_w).
 * g (NULL: the default generator) drives the random transforms and moves on by B blocks
 * when tf has any (crop with room to move, or flip_p > 0).
 * Errors (DDP_ERR_ARG): src 0-d, an index out of range (naming its position and value),
 * indices not integer or of 2 or more dims, a crop larger than the padded sample, image
 * transforms on samples with fewer than 2 dims, nchannels neither 1 nor C (or above 16),
 * a zero std, flip_p outside 0..1. */
int ddp_io_collate(ddp_tensor **out, ddp_tensor *src, ddp_tensor *indices,
                   const ddp_io_transform *tf, ddp_generator *g);

/* Stack n >= 1 tensors of one shape and dtype into a new contiguous (n, ...) tensor (the
 * collation of samples a Lua dataset returns). Errors name the first item whose shape or
 * dtype differs from item 0. */
int ddp_io_stack(ddp_tensor **out, int n, ddp_tensor **items);

/* Check that n >= 1 tensors can be stacked (ddp_io_stack's errors, DDP_ERR_ARG: no items, a
 * freed item, an item whose shape or dtype differs from item 0, items of DDP_MAX_DIMS dims)
 * without stacking them: a DataLoader worker checks a batch's parts when it makes the batch
 * and stacks them later, straight into the batch's shared memory (Note [stacking in the
 * slot], runtime/io/workers.c). */
int ddp_io_stack_check(int n, ddp_tensor **items);

/* ---------------------------------------------------------------------------------------
 * Batch loader with a prefetch thread (runtime/io/loader.c)
 *
 * A loader makes the batches of one epoch: batch b holds the samples at positions
 * [b * batch_size, (b + 1) * batch_size) of `order` (the last one shorter unless
 * drop_last), gathered from each source with ddp_io_collate's rules. With prefetch >= 1 a
 * background thread makes them in order and keeps up to `prefetch` ready; with prefetch 0
 * ddp_io_loader_next makes each on the calling thread. Both give identical batches (Note
 * [transform randomness]: position p of the epoch uses generator block offset + p; the
 * loader reserves the epoch's blocks from g when it is made).
 * ------------------------------------------------------------------------------------- */

typedef struct ddp_io_loader ddp_io_loader;

/* ddp_io_loader_next's status at the end of the epoch (not an error). */
enum { DDP_IO_END = -1 };

/* A loader over `nsources` (1..8) source tensors (N, ...) sharing N (retained until the
 * loader is freed; do not write them meanwhile), `transforms` (nsources entries, or NULL
 * for none), the epoch's sample order `order` (1-d i64 or i32 of 0-based indices in
 * 0..N-1, copied), batch_size >= 1, drop_last 0/1, prefetch >= 0 (batches kept ready by the
 * thread; 0: no thread), pin_memory 0/1 (1: each batch is copied into pinned host memory
 * by whoever makes it, the prefetch thread when there is one (which takes the calling
 * thread's current CUDA device as its own), so that to(device, non_blocking) copies it
 * asynchronously; needs CUDA: DDP_ERR_UNAVAILABLE otherwise), g
 * (NULL: the default generator) for the random transforms.
 * Errors (DDP_ERR_ARG): sizes disagree (naming the sources), an index out of range (naming
 * its position), bad batch_size / prefetch, transforms invalid for a source (as
 * ddp_io_collate); DDP_ERR_MEMORY; thread creation failure (DDP_ERR_STATE). */
int ddp_io_loader_new(ddp_io_loader **out, int nsources, ddp_tensor **sources,
                      const ddp_io_transform *transforms, ddp_tensor *order,
                      int64_t batch_size, int drop_last, int prefetch, int pin_memory,
                      ddp_generator *g);

/* The prefetch a DataLoader uses when none is given (Note [default prefetch],
 * runtime/io/loader.c): 2 (a prefetch thread) when pin_memory is 1 or when this process's
 * compute threads (ddp_get_num_threads) times its node's processes (LOCAL_WORLD_SIZE, 1
 * when unset) leave an online core free; 0 (batches made on the calling thread, split over
 * the thread pool) when they occupy every core. Never fails. */
int ddp_io_loader_default_prefetch(int pin_memory);

/* The next batch: outs[k] (nsources entries) receives a new reference to source k's batch
 * (B, ...). Returns DDP_OK, DDP_IO_END (outs set to NULL) once every batch was handed out
 * (and again on later calls), or an error: one raised on the prefetch thread is reported
 * here, with its message, after the batches made before it. Waits while the thread works. */
int ddp_io_loader_next(ddp_io_loader *loader, ddp_tensor **outs);

/* Number of batches of the epoch: ceil(len / batch_size), or floor with drop_last. */
int64_t ddp_io_loader_num_batches(const ddp_io_loader *loader);

/* Stop the thread (it finishes the batch in hand, then exits; joined here), drop the
 * batches still queued and the sources, free the loader. NULL is ignored. Safe mid-epoch. */
void ddp_io_loader_free(ddp_io_loader *loader);

/* ---------------------------------------------------------------------------------------
 * Token files (runtime/io/tokens.c)
 *
 * nanoGPT's train.bin / val.bin: the token ids of a text as raw little-endian uint16, no
 * header (so vocabularies up to 65536). Reading maps the file (mmap, read-only): opening a
 * large file costs no copy, and the pages are shared by the ranks of a node. A window at
 * start i of a file of n tokens is x = tokens[i .. i+T-1], y = tokens[i+1 .. i+T]
 * (Note [token windows]), so i runs over 0 .. n-T-1. Random windows draw their starts from
 * the generator's Philox blocks: window b of a draw uses block (seed, offset + b), start =
 * (w0 + 2^32 w1) mod (n - T); the draw moves g on by B blocks.
 * ------------------------------------------------------------------------------------- */

typedef struct ddp_io_tokens ddp_io_tokens;

/* Map the token file `path` and check it: a regular file whose size is even, every token
 * below vocab_size (1 .. 65536). Errors: DDP_ERR_IO naming the file for a file that cannot be
 * opened or mapped (with strerror), an odd size ("size 7 bytes is odd: not a file of uint16
 * tokens"), a token >= vocab_size (its 0-based position and value); DDP_ERR_ARG for a bad
 * vocab_size. An empty file opens (0 tokens). Free with ddp_io_tokens_free. */
int ddp_io_tokens_open(ddp_io_tokens **out, const char *path, int64_t vocab_size);

/* The same checks as ddp_io_tokens_open on `size` bytes in memory (a token file already
 * read, received or embedded), which are copied: the buffer may be freed after the call and
 * need not be aligned. `name` stands for the file in errors and ddp_io_tokens_path. Errors:
 * DDP_ERR_IO naming `name` for an odd size or a token >= vocab_size (its position and
 * value); DDP_ERR_ARG for an empty name, NULL data with size > 0 or a bad vocab_size;
 * DDP_ERR_MEMORY. Zero bytes give 0 tokens. Free with ddp_io_tokens_free. */
int ddp_io_tokens_from_bytes(ddp_io_tokens **out, const void *data, size_t size, const char *name,
                             int64_t vocab_size);

/* Number of tokens of the file (0 for NULL). */
int64_t ddp_io_tokens_count(const ddp_io_tokens *f);

/* The path the file was opened with ("" for NULL); valid until it is freed. */
const char *ddp_io_tokens_path(const ddp_io_tokens *f);

/* Unmap (or free the copy) and free. NULL is ignored. Tensors made from the file are copies and stay. */
void ddp_io_tokens_free(ddp_io_tokens *f);

/* Tokens [start, start + count) as a new 1-d i64 tensor (count). Errors (DDP_ERR_ARG, naming
 * the file): the range outside the file. */
int ddp_io_tokens_read(ddp_tensor **out, const ddp_io_tokens *f, int64_t start, int64_t count);

/* The windows at starts[0 .. batch) (0-based token positions): x, y new (batch, block_size)
 * i64 tensors with x[b, t] = tokens[starts[b] + t], y[b, t] = tokens[starts[b] + t + 1].
 * Errors (DDP_ERR_ARG naming the file): batch or block_size < 1, a file of fewer than
 * block_size + 1 tokens, a start outside 0 .. n - block_size - 1 (naming the window);
 * DDP_ERR_IO when a token read is >= vocab_size (the file changed since it was opened). */
int ddp_io_tokens_windows(ddp_tensor **x, ddp_tensor **y, const ddp_io_tokens *f, int64_t batch,
                          const int64_t *starts, int64_t block_size);

/* `batch` random windows (starts from g, NULL: the default generator, as described above;
 * starts, when not NULL, receives them: batch entries) as ddp_io_tokens_windows makes them.
 * Errors as ddp_io_tokens_windows. */
int ddp_io_tokens_random_windows(ddp_tensor **x, ddp_tensor **y, int64_t *starts, const ddp_io_tokens *f,
                                 int64_t batch, int64_t block_size, ddp_generator *g);

/* Write the 1-d integer tensor `tokens` (i64, i32 or u8, any strides, CPU) to `path` as
 * uint16 little-endian, atomically (a temporary file flushed, fsync'ed and renamed over
 * path, as ddp_io_save_safetensors). Errors: DDP_ERR_ARG for a tensor that is not 1-d or
 * not integer, a token outside 0 .. vocab_size-1 (its position and value), vocab_size
 * outside 1 .. 65536; DDP_ERR_IO naming the file (with strerror). */
int ddp_io_tokens_write(const char *path, ddp_tensor *tokens, int64_t vocab_size);

/* ---------------------------------------------------------------------------------------
 * BPE tokenizer through SentencePiece (runtime/io/sentencepiece.c over the C++ shim
 * sentencepiece_shim.cc; Debian's libsentencepiece, https://github.com/google/sentencepiece)
 *
 * Models trained here keep the text exactly: identity normalization, spaces kept, "\n" a
 * piece of its own (Note [newlines in SentencePiece]), every character of the corpus in
 * the vocabulary. Built without SentencePiece (NO_SENTENCEPIECE=1 or no
 * libsentencepiece-dev), every call but ddp_io_spm_available fails with
 * DDP_ERR_UNAVAILABLE.
 * ------------------------------------------------------------------------------------- */

typedef struct ddp_io_spm ddp_io_spm;

/* 1 when the runtime was built with SentencePiece, else 0. */
int ddp_io_spm_available(void);

/* Train a model of `vocab_size` pieces (2 .. 65536) on the UTF-8 text file `input` (the
 * library reads it line by line) with `model_type` ("bpe", "unigram", "char", "word"; NULL:
 * "bpe"), writing <model_prefix>.model and <model_prefix>.vocab. Uses the online cores.
 * Errors: DDP_ERR_ARG for a bad argument or a vocab_size the corpus cannot fill (the
 * library's message), DDP_ERR_IO naming a missing or empty input. */
int ddp_io_spm_train(const char *input, const char *model_prefix, int64_t vocab_size, const char *model_type);

/* Load a .model file. Errors (naming the file): missing, not a model. Free with
 * ddp_io_spm_free. */
int ddp_io_spm_load(ddp_io_spm **out, const char *model_path);

/* Free a model. NULL is ignored. */
void ddp_io_spm_free(ddp_io_spm *m);

/* Number of pieces (ids are 0 .. vocab_size-1); 0 for NULL. */
int64_t ddp_io_spm_vocab_size(const ddp_io_spm *m);

/* The ids of `len` bytes of UTF-8 text as a new 1-d i64 tensor. */
int ddp_io_spm_encode(ddp_tensor **out, const ddp_io_spm *m, const char *text, size_t len);

/* The text of ids (a 1-d integer tensor): *out gets a new NUL-terminated string of *len
 * bytes, freed with ddp_io_string_free. Errors (DDP_ERR_ARG): ids not 1-d or not integer, an
 * id outside 0 .. vocab_size-1 (naming its position). */
int ddp_io_spm_decode(char **out, size_t *len, const ddp_io_spm *m, ddp_tensor *ids);

/* Free a string the runtime returned (ddp_io_spm_decode). NULL is ignored. */
void ddp_io_string_free(char *s);

/* ---------------------------------------------------------------------------------------
 * safetensors checkpoints (runtime/io/safetensors.c)
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-endian u64 N, an
 * N-byte UTF-8 JSON header {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets":
 * [begin, end]}, ..., "__metadata__": {"key": "value", ...}} padded with spaces to a
 * multiple of 8, then the data bytes, little-endian, row-major; offsets are relative to the
 * start of the data and the tensors tile it without gaps or overlap.
 * dtypes: F32 F64 F16 BF16 I64 I32 U8 BOOL.
 * ------------------------------------------------------------------------------------- */

/* Write `n` tensors (CPU, any strides, live) named names[k] (distinct, non-empty) and
 * `nmeta` metadata pairs (keys[k], values[k]: strings) to `path`, atomically: the bytes go
 * to "<path>.tmp.<host>.<pid>", which is flushed, fsync'ed and renamed over `path`, then
 * the directory is fsync'ed; on an error it is removed. A writer killed midway leaves the
 * previous file untouched and its temporary file behind, which the next save of that path
 * removes first (ddp_io_sweep_temp_files). Errors (DDP_ERR_IO naming the path and the cause
 * with strerror; DDP_ERR_ARG naming a bad tensor or duplicate name). */
int ddp_io_save_safetensors(const char *path, int n, const char *const *names,
                            ddp_tensor **tensors, int nmeta, const char *const *keys,
                            const char *const *values);

/* An asynchronous safetensors write (runtime/io/safetensors_async.c). */
typedef struct ddp_io_async_save ddp_io_async_save;

/* Start writing what ddp_io_save_safetensors would write, on a thread of its own: the
 * tensors (CPU, live) are copied (contiguous clones, no autograd) and the strings duplicated
 * before the call returns (Note [async save snapshot]), so the caller may change them at
 * once. Wait with ddp_io_async_save_wait, free with ddp_io_async_save_free. Errors now:
 * DDP_ERR_ARG (empty path, a freed or non-CPU tensor, naming it), DDP_ERR_MEMORY; the
 * write's own errors come from the wait. */
int ddp_io_save_safetensors_async(ddp_io_async_save **out, const char *path, int n, const char *const *names,
                                  ddp_tensor **tensors, int nmeta, const char *const *keys,
                                  const char *const *values);

/* 1 when the write finished (successfully or not), else 0; 1 for NULL. */
int ddp_io_async_save_done(ddp_io_async_save *h);

/* Wait up to timeout_s seconds (<= 0: no limit) for the write: DDP_OK when the file is
 * written; the write's error (ddp_io_save_safetensors's status and message); DDP_ERR_TIMEOUT
 * naming the path when it is still running (wait again later). */
int ddp_io_async_save_wait(ddp_io_async_save *h, double timeout_s);

/* Join the writer (waiting for it) and free the handle. NULL is ignored. */
void ddp_io_async_save_free(ddp_io_async_save *h);

/* Remove the temporary files that writers of `path` killed midway left behind ("<path>.tmp.
 * <host>.<pid>" of this host whose pid no longer runs, and the "<path>.tmp.<pid>" of earlier
 * versions; a file of a writer still running, or of another host, stays). *removed (may be
 * NULL) gets how many went. A missing folder is not an error; DDP_ERR_IO when the folder
 * cannot be listed. */
int ddp_io_sweep_temp_files(const char *path, int *removed);

/* A loaded safetensors file: its tensors (in the file's data order) and metadata. */
typedef struct ddp_io_safetensors ddp_io_safetensors;

/* Read and validate a whole safetensors file. Errors (DDP_ERR_IO, naming the file, and the
 * tensor where one is at fault): cannot open, shorter than 8 bytes, header length past the
 * end of the file (or above 100 MB), header not a JSON object, an entry without dtype /
 * shape / data_offsets, unknown dtype, more than 8 dims or negative sizes, offsets out of
 * the data or not matching dtype x shape, tensors overlapping or leaving gaps, metadata
 * values that are not strings. */
int ddp_io_safetensors_load(ddp_io_safetensors **out, const char *path);

/* The same reader over a whole safetensors file already in memory (size bytes at data,
 * e.g. received from another process): the same checks and errors as
 * ddp_io_safetensors_load, the messages naming `name` (NULL: "<bytes>") where they name
 * the file. The tensors are copies: data may be freed once this returns. DDP_ERR_ARG for
 * NULL data with a non-zero size. */
int ddp_io_safetensors_load_bytes(ddp_io_safetensors **out, const void *data, size_t size,
                                  const char *name);

/* Number of tensors / metadata pairs. */
int ddp_io_safetensors_count(const ddp_io_safetensors *f);
int ddp_io_safetensors_metadata_count(const ddp_io_safetensors *f);

/* Name of tensor i (0-based; NULL when out of range); valid until the file is freed. */
const char *ddp_io_safetensors_name(const ddp_io_safetensors *f, int i);

/* Tensor i as a new reference in *out. DDP_ERR_ARG when i is out of range. */
int ddp_io_safetensors_tensor(ddp_tensor **out, const ddp_io_safetensors *f, int i);

/* Key / value of metadata pair i (NULL when out of range); valid until the file is freed. */
const char *ddp_io_safetensors_metadata_key(const ddp_io_safetensors *f, int i);
const char *ddp_io_safetensors_metadata_value(const ddp_io_safetensors *f, int i);

/* Free the file object (tensors handed out keep their own references). NULL is ignored. */
void ddp_io_safetensors_free(ddp_io_safetensors *f);

/* ---------------------------------------------------------------------------------------
 * TensorBoard event files (runtime/io/event_file.c; Lua: ddplua.utils.tensorboard)
 *
 * What torch.utils.tensorboard's SummaryWriter writes: a TFRecord file of
 * tensorboard.Event messages (proto/, the upstream names and field numbers), each record
 * framed with its length and masked CRC-32Cs (Note [event record framing]) and appended
 * with one write() (Note [event file appends]). One thread at a time per file. Every error
 * names the event file; the messages start with "SummaryWriter.<method>".
 * Common arguments: step is the global step (0 when none); walltime is seconds since the
 * epoch, NaN for the current time.
 * ------------------------------------------------------------------------------------- */

/* An event file open for writing. */
typedef struct ddp_event_file ddp_event_file;

/* Kinds of hyperparameter for ddp_event_file_add_hparams. */
enum ddp_hparam_kind { DDP_HPARAM_NUMBER = 0, DDP_HPARAM_STRING = 1, DDP_HPARAM_BOOL = 2 };

/* CRC-32C (Castagnoli) of n bytes at data, continuing from crc (0 to start): RFC 3720
 * B.4's parameters; ddp_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ddp_crc32c(uint32_t crc, const void *data, size_t n);

/* Create log_dir (and its parents) when missing and a new event file in it named
 * "events.out.tfevents.<10-digit seconds>.<host>.<pid>.<counter><filename_suffix>"
 * (tensorboard's name; suffix NULL or ""), whose first record is the file-version event
 * ("brain.Event:2"). Errors: DDP_ERR_ARG for an empty log_dir; DDP_ERR_IO when the folder
 * or the file cannot be created (naming it, with strerror); DDP_ERR_MEMORY. */
int ddp_event_file_open(ddp_event_file **out, const char *log_dir, const char *filename_suffix);

/* The file's path (valid until it is closed; "" for NULL). */
const char *ddp_event_file_path(const ddp_event_file *f);

/* Append a scalar (Summary.Value.simple_value: value rounded to f32), as PyTorch's
 * add_scalar. Errors: DDP_ERR_ARG for an empty tag; DDP_ERR_IO on a failed write. */
int ddp_event_file_add_scalar(ddp_event_file *f, const char *tag, double value, int64_t step,
                              double walltime);

/* Append a histogram of the n (> 0) finite values (HistogramProto: min, max, num, sum,
 * sum_squares, bucket_limit, bucket), computed as PyTorch's add_histogram does (Note
 * [histogram buckets]): bins from edges (nedges >= 2, increasing) when edges is not NULL,
 * else nbins equal bins from min to max when nbins > 0, else (nbins 0) TensorBoard's
 * default exponential bins; max_bins > 0 merges bins down to at most that many.
 * Errors (DDP_ERR_ARG): no values ("The input has no element"), a NaN or infinity (naming
 * the element), edges not increasing, nbins < 0, no value inside the bins; DDP_ERR_IO. */
int ddp_event_file_add_histogram(ddp_event_file *f, const char *tag, const double *values, int64_t n,
                                 int64_t nbins, const double *edges, int64_t nedges, int64_t max_bins,
                                 int64_t step, double walltime);

/* Append a text summary as PyTorch's add_text: tag "<tag>/text_summary", a DT_STRING
 * tensor of shape (1) holding text (UTF-8), plugin "text". Errors: DDP_ERR_ARG for an
 * empty tag or NULL text; DDP_ERR_IO. */
int ddp_event_file_add_text(ddp_event_file *f, const char *tag, const char *text, int64_t step,
                            double walltime);

/* Append the hparams plugin's three summaries as PyTorch's add_hparams writes them (tags
 * "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"):
 * the n hyperparameters names[i] of kind kinds[i] (enum ddp_hparam_kind) with value
 * numbers[i] (NUMBER; BOOL: non-zero is true) or strings[i] (STRING), and the nmetrics
 * metric tags (their values are scalars the caller adds). PyTorch writes these into a
 * file of their own (log_dir/<run_name>). Errors (DDP_ERR_ARG): an empty name or tag, an
 * unknown kind, a NULL string; DDP_ERR_IO; DDP_ERR_MEMORY. */
int ddp_event_file_add_hparams(ddp_event_file *f, int n, const char *const *names, const int *kinds,
                               const double *numbers, const char *const *strings, int nmetrics,
                               const char *const *metric_tags, int64_t step, double walltime);

/* fsync the file: what was appended survives a machine crash (records are already in the
 * file for readers: Note [event file appends]). Errors: DDP_ERR_STATE for NULL,
 * DDP_ERR_IO. */
int ddp_event_file_flush(ddp_event_file *f);

/* fsync, close and free the file (NULL: nothing). Returns DDP_ERR_IO when the sync or
 * the close failed; the object is freed all the same. */
int ddp_event_file_close(ddp_event_file *f);
