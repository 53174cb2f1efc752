/* repl_wire.c: the distributed REPL's frame reader and handshake payload parsers
 * (repl_wire.h). Everything here is a pure function of its bytes: no sockets, no Lua. */
#include "repl_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ddp_repl_reader_init(ddp_repl_reader *r, size_t max) {
  memset(r, 0, sizeof *r);
  r->max = max < DDP_REPL_FRAME_MAX ? max : DDP_REPL_FRAME_MAX;
}

void ddp_repl_reader_free(ddp_repl_reader *r) {
  free(r->data);
  r->data = NULL;
  r->head_got = r->got = r->len = 0;
}

/* The head's length field: exactly 10 decimal digits (strtoull would take signs and spaces,
 * and "-1" would read as 2^64 - 1). -1 when it is not. */
static int head_length(const char *digits, size_t *len) {
  size_t v = 0;
  for (int i = 0; i < 10; i++) {
    if (digits[i] < '0' || digits[i] > '9') return -1;
    v = v * 10 + (size_t)(digits[i] - '0'); /* 10 digits fit in 64 bits */
  }
  *len = v;
  return 0;
}

int ddp_repl_reader_feed(ddp_repl_reader *r, const char *bytes, size_t n, size_t *used) {
  size_t i = 0;
  *used = 0;
  if (r->error) return -1;
  if (r->head_got < DDP_REPL_HEAD_BYTES) {
    size_t take = DDP_REPL_HEAD_BYTES - r->head_got;
    if (take > n) take = n;
    memcpy(r->head + r->head_got, bytes, take);
    r->head_got += take;
    i += take;
    *used = i;
    if (r->head_got < DDP_REPL_HEAD_BYTES) return 0;
    r->type = r->head[0];
    if (head_length(r->head + 1, &r->len) != 0) {
      r->error = "a frame's length is not 10 decimal digits";
      return -1;
    }
    if (r->len > r->max) {
      r->error = "a frame is longer than this stage of the protocol allows";
      return -1;
    }
    r->data = malloc(r->len + 1);
    if (!r->data) {
      r->error = "out of memory for a frame";
      return -1;
    }
    r->got = 0;
  }
  size_t take = r->len - r->got;
  if (take > n - i) take = n - i;
  if (take) memcpy(r->data + r->got, bytes + i, take);
  r->got += take;
  i += take;
  *used = i;
  if (r->got < r->len) return 0;
  r->data[r->len] = '\0';
  return 1;
}

size_t ddp_repl_reader_want(const ddp_repl_reader *r) {
  if (r->head_got < DDP_REPL_HEAD_BYTES) return DDP_REPL_HEAD_BYTES - r->head_got;
  return r->len > r->got ? r->len - r->got : 1;
}

void ddp_repl_reader_take(ddp_repl_reader *r, char *type, char **data, size_t *len) {
  *type = r->type;
  *data = r->data;
  *len = r->len;
  r->data = NULL;
  r->head_got = r->got = r->len = 0;
}

void ddp_repl_frame_head(char head[DDP_REPL_HEAD_BYTES], char type, size_t len) {
  char buf[DDP_REPL_HEAD_BYTES + 1];
  snprintf(buf, sizeof buf, "%c%010zu", type, len);
  memcpy(head, buf, DDP_REPL_HEAD_BYTES);
}

/* 1 when p[0 .. 63] are lowercase hex digits. */
static int is_hex64(const char *p) {
  for (int i = 0; i < DDP_REPL_NONCE_HEX; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) return 0;
  return 1;
}

int ddp_repl_parse_hello(const char *p, size_t len, int max_rank, int *rank, char *nonce) {
  size_t i = 0;
  long v = 0;
  while (i < len && i < 4 && p[i] >= '0' && p[i] <= '9') v = v * 10 + (p[i++] - '0');
  if (i == 0 || i >= len || p[i] != ' ' || v >= max_rank) return -1;
  i++;
  if (len - i != DDP_REPL_NONCE_HEX || !is_hex64(p + i)) return -1;
  *rank = (int)v;
  memcpy(nonce, p + i, DDP_REPL_NONCE_HEX);
  nonce[DDP_REPL_NONCE_HEX] = '\0';
  return 0;
}

int ddp_repl_parse_answer(const char *p, size_t len, char *nonce, char *mac) {
  if (len != 2 * DDP_REPL_NONCE_HEX + 1 || p[DDP_REPL_NONCE_HEX] != ' ' || !is_hex64(p) ||
      !is_hex64(p + DDP_REPL_NONCE_HEX + 1))
    return -1;
  memcpy(nonce, p, DDP_REPL_NONCE_HEX);
  nonce[DDP_REPL_NONCE_HEX] = '\0';
  memcpy(mac, p + DDP_REPL_NONCE_HEX + 1, DDP_REPL_NONCE_HEX);
  mac[DDP_REPL_NONCE_HEX] = '\0';
  return 0;
}

int ddp_repl_parse_proof(const char *p, size_t len, char *mac) {
  if (len != DDP_REPL_NONCE_HEX || !is_hex64(p)) return -1;
  memcpy(mac, p, DDP_REPL_NONCE_HEX);
  mac[DDP_REPL_NONCE_HEX] = '\0';
  return 0;
}
