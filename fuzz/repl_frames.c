/* fuzz/repl_frames.c: the distributed REPL's frames in both directions (runtime/cli/
 * repl_wire.c, Note [no partial frames] in runtime/cli/dist_repl.c), through the same reader
 * and payload parsers the prompt and the ranks use.
 *
 * Input: byte 0 picks the side (even: the prompt reading a rank, whose first two frames are
 * bounded by DDP_REPL_HANDSHAKE_MAX; odd: a rank reading the prompt, whose first frame is
 * the handshake answer), byte 1 seeds the sizes of the pieces the stream arrives in, the rest
 * is the stream. Contract: the stream cut in pieces gives the same frames as the stream fed
 * whole; no frame is longer than the limit of its stage; a frame is handed out only whole;
 * a parsed hello names a rank below the job's size and 64 hex digits; a parsed answer or
 * proof holds 64 hex digits each. */
#include "fuzz.h"

#include "cli/repl_wire.h"

enum { MAX_FRAMES = 64, POST_AUTH_MAX = 1 << 20, FUZZ_RANKS = 8 };

typedef struct frame {
  char type;
  char *data;
  size_t len;
} frame;

static int is_hex(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
  return 1;
}

/* The limit of the stream's k-th frame on this side. */
static size_t limit(int prompt_side, int k) {
  if (prompt_side) return k < 2 ? DDP_REPL_HANDSHAKE_MAX : POST_AUTH_MAX;
  return k < 1 ? DDP_REPL_HANDSHAKE_MAX : POST_AUTH_MAX;
}

/* Read frames from the stream in pieces of sizes drawn from `seed` (0: whole). Returns the
 * number of frames read; *bad is 1 when the stream ended in an error. */
static int read_stream(int prompt_side, const uint8_t *p, size_t n, unsigned seed, frame *out, int *bad) {
  ddp_repl_reader r;
  int k = 0;
  ddp_repl_reader_init(&r, limit(prompt_side, 0));
  size_t at = 0;
  *bad = 0;
  while (at < n && k < MAX_FRAMES) {
    size_t piece = seed ? 1 + (seed = seed * 1103515245u + 12345u) % 37 : n - at;
    if (piece > n - at) piece = n - at;
    size_t used_all = 0;
    while (used_all < piece && k < MAX_FRAMES) {
      size_t used;
      int st = ddp_repl_reader_feed(&r, (const char *)p + at + used_all, piece - used_all, &used);
      FUZZ_CHECK(used <= piece - used_all, "used %zu of %zu", used, piece - used_all);
      used_all += used;
      if (st < 0) {
        FUZZ_CHECK(r.error != NULL, "a failed feed without a reason");
        *bad = 1;
        ddp_repl_reader_free(&r);
        return k;
      }
      if (st == 1) {
        ddp_repl_reader_take(&r, &out[k].type, &out[k].data, &out[k].len);
        FUZZ_CHECK(out[k].len <= limit(prompt_side, k), "frame %d of %zu bytes over its limit", k, out[k].len);
        FUZZ_CHECK(out[k].data[out[k].len] == '\0', "frame %d not NUL-terminated", k);
        k++;
        ddp_repl_reader_init(&r, limit(prompt_side, k));
      } else {
        FUZZ_CHECK(used_all == piece, "a frame still incomplete left %zu bytes unread", piece - used_all);
      }
    }
    at += used_all;
  }
  ddp_repl_reader_free(&r);
  return k;
}

/* The payload parsers of this side on each frame, with their contracts. */
static void parse_frames(int prompt_side, const frame *f, int n) {
  for (int i = 0; i < n; i++) {
    char nonce[65], mac[65];
    int rank = -1;
    if (prompt_side && f[i].type == 'H' &&
        ddp_repl_parse_hello(f[i].data, f[i].len, FUZZ_RANKS, &rank, nonce) == 0) {
      FUZZ_CHECK(rank >= 0 && rank < FUZZ_RANKS, "hello named rank %d", rank);
      FUZZ_CHECK(strlen(nonce) == 64 && is_hex(nonce, 64), "hello nonce '%s'", nonce);
    }
    if (prompt_side && f[i].type == 'P' && ddp_repl_parse_proof(f[i].data, f[i].len, mac) == 0)
      FUZZ_CHECK(strlen(mac) == 64 && is_hex(mac, 64), "proof '%s'", mac);
    if (!prompt_side && f[i].type == 'A' && ddp_repl_parse_answer(f[i].data, f[i].len, nonce, mac) == 0)
      FUZZ_CHECK(is_hex(nonce, 64) && is_hex(mac, 64) && strlen(mac) == 64, "answer '%s' '%s'", nonce, mac);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int prompt_side = (data[0] & 1) == 0;
  unsigned seed = data[1] | 1u;
  const uint8_t *p = data + 2;
  size_t n = size - 2;
  static frame whole[MAX_FRAMES], cut[MAX_FRAMES];
  int bad_whole, bad_cut;
  int nw = read_stream(prompt_side, p, n, 0, whole, &bad_whole);
  int nc = read_stream(prompt_side, p, n, seed, cut, &bad_cut);
  FUZZ_CHECK(nw == nc && bad_whole == bad_cut, "whole: %d frames (bad %d), in pieces: %d (bad %d)", nw,
             bad_whole, nc, bad_cut);
  for (int i = 0; i < nw; i++) {
    FUZZ_CHECK(whole[i].type == cut[i].type && whole[i].len == cut[i].len &&
               memcmp(whole[i].data, cut[i].data, whole[i].len) == 0, "frame %d differs when cut", i);
    char head[DDP_REPL_HEAD_BYTES];
    ddp_repl_frame_head(head, whole[i].type, whole[i].len);
    FUZZ_CHECK(head[0] == whole[i].type, "head type");
  }
  parse_frames(prompt_side, whole, nw);
  for (int i = 0; i < nw; i++) free(whole[i].data);
  for (int i = 0; i < nc; i++) free(cut[i].data);
  return 0;
}
