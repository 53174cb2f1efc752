/* ddplua/arrays.h: part of the public API, included by ddplua.h only.
 *
 * NumPy array files and CSV tables (runtime/io/npy.c, runtime/io/csv.c): .npy files
 * (NumPy's format, https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html),
 * .npz archives of them (zip files, read with libzip) and CSV files of numbers (parsed with
 * libcsv). Every reader names the file (and the entry, line or field) and the fault in its
 * error (DDP_ERR_IO) and never crashes on malformed input.
 */

/* Read a .npy file (format versions 1.0, 2.0 and 3.0) into a new contiguous CPU tensor of
 * its shape (a 0-d tensor for shape ()). dtypes (descr, any byte order '<', '>', '|', '='):
 * f2 -> f16, f4 -> f32, f8 -> f64, i1 i2 i4 -> i32, i8 -> i64, u1 -> u8, u2 -> i32,
 * u4 -> i64, b1 -> bool; Fortran-order arrays are made row-major. Errors (DDP_ERR_IO,
 * naming the file): cannot open, wrong magic, an unknown version, a header that is not
 * NumPy's dict literal (the part at fault), a dtype without a ddplua equivalent (uint64,
 * complex, strings, objects, records: the descr), more than 8 dimensions, sizes whose
 * product overflows or passes 2^33 bytes, truncated data or trailing bytes. */
int ddp_npy_read(ddp_tensor **out, const char *path);

/* The reader of ddp_npy_read over a whole .npy file already in memory (size bytes at data):
 * the same results, checks and errors, the messages naming `name` (NULL: "<bytes>"). */
int ddp_npy_decode(ddp_tensor **out, const void *data, size_t size, const char *name);

/* The arrays of an .npz file, in the archive's order. Opaque; free with ddp_npz_free. */
typedef struct ddp_npz ddp_npz;

/* Read an .npz file (numpy.savez / savez_compressed: a zip archive, stored or deflated
 * entries, of .npy files) with every array decoded. Entries whose name does not end in
 * ".npy" are skipped. Errors (DDP_ERR_IO): the file cannot be opened or is not a zip
 * archive (libzip's message), an entry cannot be read or inflated (naming it), an entry's
 * .npy error (as ddp_npy_decode, naming "<file>:<entry>"), more than 2^33 bytes inflated in
 * all. */
int ddp_npz_read(ddp_npz **out, const char *path);

/* ddp_npz_read over a whole .npz file already in memory, naming `name` (NULL: "<bytes>"). */
int ddp_npz_decode(ddp_npz **out, const void *data, size_t size, const char *name);

/* Number of arrays of z. */
int ddp_npz_count(const ddp_npz *z);

/* Name of array i (0 <= i < count) without its ".npy" suffix (as numpy.load's keys),
 * owned by z; NULL when i is out of range. */
const char *ddp_npz_name(const ddp_npz *z, int i);

/* Array i as a new reference (the caller releases it); NULL when i is out of range. */
ddp_tensor *ddp_npz_array(const ddp_npz *z, int i);

/* Free z and its references to the arrays (NULL is fine). */
void ddp_npz_free(ddp_npz *z);

/* Read a CSV file of numbers (RFC 4180 quoting, parsed by libcsv; `delimiter` a byte such
 * as ',' or '\t') into a new f64 tensor (rows, columns). With header = 1 the first record
 * holds the column names: they are written to names (cap bytes) one after the other, each
 * ending with a NUL byte, and *needed is set to the bytes they take (0 without a header);
 * names may be NULL when cap is 0. Empty fields are NaN (as pandas reads them); other
 * fields (at most 255 bytes) are read by strtod after trimming spaces ("nan", "inf", hex
 * floats included).
 * Blank lines are skipped. Errors: DDP_ERR_ARG when cap < *needed (nothing else is
 * returned; call again with a larger buffer); DDP_ERR_IO naming the file and: cannot
 * open, no data rows, a record whose field count differs from the first's (its number), a
 * field that is not a number (record, column (1-based) and the text), a column name
 * holding a NUL byte, a malformed quoted field (libcsv's message), more than 2^28 fields. */
int ddp_csv_read(ddp_tensor **out, const char *path, int delimiter, int header, char *names,
                 size_t cap, size_t *needed);

/* ddp_csv_read over a whole CSV file already in memory, naming `name` (NULL: "<bytes>"). */
int ddp_csv_decode(ddp_tensor **out, const void *data, size_t size, const char *name,
                   int delimiter, int header, char *names, size_t cap, size_t *needed);
