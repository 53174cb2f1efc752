/* repl_wire.h: the distributed REPL's frames and handshake payloads (runtime/cli/dist_repl.c,
 * Note [distributed REPL], Note [REPL handshake]), as pure functions over bytes so that the
 * prompt, the ranks and the fuzz target parse them with the same code.
 *
 * A frame: one type byte, the payload length as exactly 10 decimal digits, the payload.
 * Types: 'H' hello (rank -> prompt), 'A' answer (prompt -> rank), 'P' proof (rank -> prompt),
 * 'L' an input to run on every rank (prompt -> rank), 'R' an input for this rank alone
 * (%rank K), 'I' interrupt (prompt -> rank, empty), 'O' what an input printed (rank ->
 * prompt).
 */
#ifndef DDPLUA_CLI_REPL_WIRE_H
#define DDPLUA_CLI_REPL_WIRE_H

#include <stddef.h>

#define DDP_REPL_HEAD_BYTES 11                  /* type byte + 10 digits */
#define DDP_REPL_HANDSHAKE_MAX 256              /* payload bytes of a handshake frame */
#define DDP_REPL_FRAME_MAX ((size_t)1 << 30)    /* payload bytes of any frame (1 GiB) */
#define DDP_REPL_NONCE_HEX 64                   /* a nonce: 64 hex digits (256 bits) */

/* An incremental frame reader: bytes go in as they arrive (in pieces of any size), whole
 * frames come out. `max` bounds the payload (a longer announced length is an error before
 * any byte of it is stored). */
typedef struct ddp_repl_reader {
  char head[DDP_REPL_HEAD_BYTES];
  size_t head_got;  /* bytes of head[] filled */
  char type;        /* the frame's type, once the head is complete */
  char *data;       /* (len + 1) bytes, malloc'd once the head is complete; NUL-terminated */
  size_t len, got;  /* announced payload length, bytes of it received */
  size_t max;       /* the largest payload accepted */
  const char *error; /* why the stream is bad (static text), or NULL */
} ddp_repl_reader;

/* Start a reader that accepts payloads of at most `max` bytes. */
void ddp_repl_reader_init(ddp_repl_reader *r, size_t max);

/* Free what the reader holds (safe to call twice; the reader can then be init'ed again). */
void ddp_repl_reader_free(ddp_repl_reader *r);

/* Feed `n` bytes. *used is set to how many were consumed (bytes past a complete frame are
 * left for the next call). Returns 1 when a frame is complete (take it with
 * ddp_repl_reader_take), 0 when more bytes are needed, -1 when the stream is bad: a length
 * that is not 10 decimal digits, over `max`, or no memory (r->error says which). */
int ddp_repl_reader_feed(ddp_repl_reader *r, const char *bytes, size_t n, size_t *used);

/* How many bytes the current frame still needs before its head or its payload is complete
 * (at least 1). A caller that reads no more than this from a stream never takes bytes of the
 * next frame, so another reader (a thread) can take over the stream between frames. */
size_t ddp_repl_reader_want(const ddp_repl_reader *r);

/* Hand over the complete frame: *type, *data (malloc'd, NUL-terminated, the caller frees it)
 * and *len; the reader is ready for the next frame. Only after feed returned 1. */
void ddp_repl_reader_take(ddp_repl_reader *r, char *type, char **data, size_t *len);

/* Write the 11-byte head of a frame of `type` and `len` payload bytes into head. */
void ddp_repl_frame_head(char head[DDP_REPL_HEAD_BYTES], char type, size_t len);

/* Parse a hello payload "<rank> <nonce_r>": rank a decimal 0..max_rank-1 without sign or
 * leading spaces, nonce 64 lowercase hex digits. Returns 0 and fills rank and nonce (65
 * bytes), or -1. */
int ddp_repl_parse_hello(const char *p, size_t len, int max_rank, int *rank, char *nonce);

/* Parse an answer payload "<nonce_p> <mac_p>": two runs of 64 lowercase hex digits. Returns
 * 0 and fills nonce and mac (65 bytes each), or -1. */
int ddp_repl_parse_answer(const char *p, size_t len, char *nonce, char *mac);

/* Parse a proof payload "<mac_r>": 64 lowercase hex digits. Returns 0 and fills mac, or -1. */
int ddp_repl_parse_proof(const char *p, size_t len, char *mac);

#endif
