/* runtime/io/sentencepiece_shim.h: the C face of the SentencePiece shim
 * (runtime/io/sentencepiece_shim.cc, the io layer's only C++). Each call returns a ddplua
 * status (DDP_OK or a DDP_ERR_*) and, on failure, writes the message into err
 * (DDP_SPM_ERR_CAP bytes); no exception crosses it. runtime/io/sentencepiece.c turns those
 * into the public ddp_io_spm_* calls (ddp_last_error). Built without SentencePiece
 * (NO_SENTENCEPIECE=1, or no libsentencepiece-dev) every call returns
 * DDP_ERR_UNAVAILABLE. */
#ifndef DDP_IO_SENTENCEPIECE_SHIM_H
#define DDP_IO_SENTENCEPIECE_SHIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DDP_SPM_ERR_CAP = 512 };

typedef struct ddp_spm_model ddp_spm_model;

/* 1 when the library was built with SentencePiece. */
int ddp_spm_shim_available(void);

/* Train a model on the UTF-8 text file `input` (one sentence per line) into
 * <model_prefix>.model and <model_prefix>.vocab: model_type "bpe" or "unigram", vocab_size
 * pieces, every character kept (character_coverage 1), text kept as it is (identity
 * normalization, spaces not collapsed) and "\n" a piece of its own (Note [newlines in
 * SentencePiece] in sentencepiece.c). Quiet unless it fails. */
int ddp_spm_shim_train(const char *input, const char *model_prefix, int vocab_size, const char *model_type,
                       int num_threads, char *err);

/* Load a .model file. */
int ddp_spm_shim_load(ddp_spm_model **out, const char *path, char *err);
void ddp_spm_shim_free(ddp_spm_model *m);
int ddp_spm_shim_vocab_size(const ddp_spm_model *m);

/* Encode len bytes of UTF-8 text: *ids (malloc'd, free()) gets *n ids. */
int ddp_spm_shim_encode(const ddp_spm_model *m, const char *text, size_t len, int **ids, size_t *n, char *err);

/* Decode n ids (each in 0 .. vocab_size-1, checked by the caller): *text (malloc'd, NUL-
 * terminated, free()) gets *len bytes. */
int ddp_spm_shim_decode(const ddp_spm_model *m, const int *ids, size_t n, char **text, size_t *len, char *err);

#ifdef __cplusplus
}
#endif

#endif /* DDP_IO_SENTENCEPIECE_SHIM_H */
