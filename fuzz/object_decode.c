/* fuzz/object_decode.c: the bytes of the object collectives (all_gather_object,
 * broadcast_object_list, ...) through ddp_object_parse, the check lua/ddplua/distributed/
 * objects.lua runs on every value a rank receives before building Lua values from its items
 * (Note [object bytes] in runtime/include/ddplua/objects.h). Contract: an error says
 * "corrupt data"; the counting pass and the listing pass agree; the items of accepted bytes
 * lie inside them and, written back in the format, give the same bytes (the format has one
 * spelling per item list, so nothing was skipped or invented); keys are never nil, NaN or
 * tables. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int64_t count = -1;
  int status = ddp_object_parse(data, size, NULL, 0, &count);
  if (status) {
    FUZZ_CHECK(strstr(ddp_last_error(), "corrupt data"), "error: %s", ddp_last_error());
    return 0;
  }
  FUZZ_CHECK(count >= 1 && (size_t)count <= size, "%lld items in %zu bytes", (long long)count, size);
  ddp_object_item *items = malloc(sizeof *items * (size_t)count);
  if (!items) return 0;
  int64_t again = -1;
  FUZZ_CHECK(ddp_object_parse(data, size, items, count, &again) == 0 && again == count,
             "the listing pass disagrees (%lld items, then %lld)", (long long)count, (long long)again);
  uint8_t *back = malloc(size);
  if (!back) {
    free(items);
    return 0;
  }
  size_t at = 0;
  for (int64_t i = 0; i < count; i++) {
    const ddp_object_item *it = &items[i];
    FUZZ_CHECK(at < size, "item %lld past the bytes", (long long)i);
    back[at++] = it->tag;
    if (it->tag == 'd') {
      FUZZ_CHECK(it->pos == at && it->pos + 8 <= size, "number %lld at %llu", (long long)i, (unsigned long long)it->pos);
      memcpy(back + at, data + it->pos, 8);
      at += 8;
    } else if (it->tag == 's' || it->tag == 'T') {
      FUZZ_CHECK(at + 4 <= size, "length of item %lld past the bytes", (long long)i);
      for (int b = 0; b < 4; b++) back[at++] = (uint8_t)(it->len >> (8 * b));
      if (it->tag == 's') {
        FUZZ_CHECK(it->pos == at && it->pos + it->len <= size, "string %lld at %llu", (long long)i,
                   (unsigned long long)it->pos);
        memcpy(back + at, data + it->pos, it->len);
        at += it->len;
      }
    } else {
      FUZZ_CHECK(it->tag == 'n' || it->tag == 't' || it->tag == 'f', "tag %d", it->tag);
    }
  }
  FUZZ_CHECK(at == size && memcmp(back, data, size) == 0, "the items spell %zu other bytes", at);
  /* keys: walk the tables with a stack of values left, as a reader would */
  int64_t left[DDP_OBJECT_MAX_DEPTH + 2];
  int depth = 0;
  left[0] = 1;
  for (int64_t i = 0; i < count; i++) {
    while (left[depth] == 0) depth--;
    int is_key = depth > 0 && left[depth] % 2 == 0;
    left[depth]--;
    const ddp_object_item *it = &items[i];
    if (is_key) {
      double v = 0;
      if (it->tag == 'd') memcpy(&v, data + it->pos, 8);
      FUZZ_CHECK(it->tag != 'n' && it->tag != 'T' && v == v, "item %lld: a bad key was accepted", (long long)i);
    }
    if (it->tag == 'T') {
      FUZZ_CHECK(depth < DDP_OBJECT_MAX_DEPTH, "tables deeper than %d accepted", DDP_OBJECT_MAX_DEPTH);
      left[++depth] = 2 * (int64_t)it->len;
    }
  }
  free(back);
  free(items);
  return 0;
}
