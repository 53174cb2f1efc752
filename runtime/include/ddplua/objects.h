/* ddplua/objects.h: part of the public API, included by ddplua.h only.
 *
 * The bytes of the object collectives (all_gather_object, broadcast_object_list, ...:
 * lua/ddplua/distributed/objects.lua): what a rank receives from its peers is checked here,
 * in C, before Lua builds any value from it (runtime/comm/objects.c).
 *
 * Note [object bytes]: one value is one tag byte, then
 *   'n' nil | 'f' false | 't' true | 'd' 8 bytes, a double (little-endian)
 *   's' u32 length (little-endian), that many bytes | 'T' u32 pair count, then count times
 *   (key, value)
 * Keys are strings, numbers (never NaN) or booleans; tables nest at most
 * DDP_OBJECT_MAX_DEPTH deep (the sender refuses deeper ones); the bytes hold exactly one
 * value. A sender following the format never breaks these rules, so bytes that do are
 * corrupt (or hostile) and are refused whole.
 */

enum { DDP_OBJECT_MAX_DEPTH = 512 };

/* One value of the bytes, in the order of the bytes (a table's items follow it: key,
 * value, key, value, ...). */
typedef struct ddp_object_item {
  uint8_t tag;  /* 'n' 'f' 't' 'd' 's' 'T' */
  uint32_t len; /* 's': bytes of the string; 'T': its pairs */
  uint64_t pos; /* 'd', 's': offset of the double's or string's bytes */
} ddp_object_item;

/* Check that the `size` bytes at data are one whole value (Note [object bytes]) and list its
 * items: the first `cap` of them into items (NULL with cap 0 only counts), their number in
 * *count. Errors (DDP_ERR_IO, "... (corrupt data)", naming the byte offset): the bytes end
 * inside a value, an unknown tag, a nil, NaN or table key, tables nested deeper than
 * DDP_OBJECT_MAX_DEPTH, bytes after the value. DDP_ERR_ARG for NULL data with a non-zero
 * size. */
int ddp_object_parse(const uint8_t *data, size_t size, ddp_object_item *items, int64_t cap,
                     int64_t *count);
