/* runtime/comm/objects.c: the check of the object collectives' bytes (Note [object
 * bytes] in ddplua/objects.h), run on what a rank receives before lua/ddplua/distributed/
 * objects.lua builds Lua values from the items listed here. Iterative (an explicit stack
 * of the open tables), so hostile nesting costs no C or Lua stack. */
#include <string.h>

#include "core/core.h"

/* What the caller reads from the message: the byte offset and the total. */
#define CORRUPT(...) DDP_FAIL(DDP_ERR_IO, __VA_ARGS__)

int ddp_object_parse(const uint8_t *data, size_t size, ddp_object_item *items, int64_t cap,
                     int64_t *count) {
  *count = 0;
  if (!data && size) DDP_FAIL(DDP_ERR_ARG, "object bytes: data is NULL (size %zu)", size);
  /* open[d]: values still to come in the table at depth d (its pairs times 2); depth 0 is
   * the top level, which holds one value */
  uint64_t open[DDP_OBJECT_MAX_DEPTH + 1];
  int depth = 0;
  open[0] = 1;
  size_t pos = 0;
  int64_t n = 0;
  while (depth >= 0) {
    if (open[depth] == 0) {
      depth--;
      continue;
    }
    /* in a table, an even count left means a key comes next */
    int is_key = depth > 0 && open[depth] % 2 == 0;
    open[depth]--;
    size_t at = pos;
    if (size - pos < 1)
      CORRUPT("object bytes: the bytes end inside a value (a tag at byte %zu of %zu; corrupt data)", pos, size);
    ddp_object_item it = {data[pos++], 0, 0};
    switch (it.tag) {
      case 'n':
        if (is_key) CORRUPT("object bytes: a nil key at byte %zu (corrupt data)", at);
        break;
      case 'f':
      case 't': break;
      case 'd': {
        if (size - pos < 8)
          CORRUPT("object bytes: the bytes end inside a value (a number at byte %zu of %zu; corrupt data)", at, size);
        double v;
        memcpy(&v, data + pos, 8);
        if (is_key && v != v) CORRUPT("object bytes: a NaN key at byte %zu (corrupt data)", at);
        it.pos = pos;
        pos += 8;
        break;
      }
      case 's':
      case 'T': {
        if (size - pos < 4)
          CORRUPT("object bytes: the bytes end inside a value (a length at byte %zu of %zu; corrupt data)", at, size);
        it.len = (uint32_t)data[pos] | (uint32_t)data[pos + 1] << 8 | (uint32_t)data[pos + 2] << 16 |
                 (uint32_t)data[pos + 3] << 24;
        pos += 4;
        if (it.tag == 's') {
          if (size - pos < it.len)
            CORRUPT("object bytes: the bytes end inside a value (a string of %u bytes at byte %zu, %zu bytes in all; corrupt data)",
                    it.len, at, size);
          it.pos = pos;
          pos += it.len;
          break;
        }
        if (is_key) CORRUPT("object bytes: a table key at byte %zu (corrupt data)", at);
        if (depth == DDP_OBJECT_MAX_DEPTH)
          CORRUPT("object bytes: tables nested deeper than %d at byte %zu (corrupt data)",
                  DDP_OBJECT_MAX_DEPTH, at);
        open[++depth] = 2 * (uint64_t)it.len;
        break;
      }
      default:
        CORRUPT("object bytes: unknown tag %d at byte %zu (corrupt data)", it.tag, at);
    }
    if (n < cap) items[n] = it;
    n++;
  }
  if (pos != size)
    CORRUPT("object bytes: %zu trailing bytes after the value (corrupt data)", size - pos);
  *count = n;
  return DDP_OK;
}
