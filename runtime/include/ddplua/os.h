/* ddplua/os.h: part of the public API, included by ddplua.h only.
 *
 * The few operating-system services the Lua front end, the tools and the benchmarks need
 * (a monotonic clock, a sleep, terminals, folders, resource usage, byte comparison), so that Lua
 * declares no libc functions of its own (DESIGN.md: the FFI sees ddplua.h and nothing
 * else). Thin wrappers over POSIX; each is safe to call from any thread. */

/* Seconds from a monotonic clock (CLOCK_MONOTONIC): for measuring intervals, not for the
 * time of day. Never fails; nanosecond resolution on Linux. */
double ddp_os_monotonic_seconds(void);

/* Seconds since the Unix epoch (CLOCK_REALTIME, Python's time.time()): the time of day,
 * e.g. the wall_time of TensorBoard events. Never fails. */
double ddp_os_wall_seconds(void);

/* Sleep `seconds` (0 .. 1e9, fractions allowed) on the monotonic clock. A signal whose
 * handler runs meanwhile (SIGUSR1's flight-recorder dump, Note [flight recorder]) does not
 * cut it short: the sleep resumes until the deadline, as Python's time.sleep (PEP 475);
 * libc's sleep/usleep return early there. DDP_ERR_ARG for a negative, NaN or huge value;
 * DDP_ERR_IO when the clock refuses. */
int ddp_os_sleep(double seconds);

/* 1 when file descriptor `fd` (0 stdin, 1 stdout, 2 stderr) is a terminal, else 0 (also
 * for a closed or invalid descriptor). */
int ddp_os_isatty(int fd);

/* Create folder `path` and every missing parent, as `mkdir -p` does (mode 0777 before the
 * umask). An existing folder is success. DDP_ERR_ARG for a NULL or empty path;
 * DDP_ERR_IO naming the path, the component that could not be made and the reason
 * (strerror), e.g. "mkdir -p 'a/b/c': cannot create 'a/b': Not a directory". */
int ddp_os_mkdir_p(const char *path);

/* The entries of folder `path` ("." and ".." left out), unsorted, as records of one type
 * byte ('d' a folder, 'f' a regular file, 'o' anything else; symbolic links followed, a
 * dangling one is 'o') then the name and a NUL byte, written to buf (cap bytes); *needed
 * is set to the bytes all the records take. When cap < *needed the buffer holds only part
 * of them and DDP_ERR_ARG is returned with *needed set: retry with a larger buffer.
 * Errors: DDP_ERR_ARG for a NULL path or needed; DDP_ERR_IO naming the folder and the
 * reason (strerror) when it cannot be opened or read. */
int ddp_os_list_dir(const char *path, char *buf, size_t cap, size_t *needed);

/* Resource usage of the calling process so far (getrusage(RUSAGE_SELF)). */
typedef struct ddp_os_rusage {
  int64_t peak_rss_bytes; /* largest resident set size reached, bytes */
  double user_seconds;    /* CPU time in user mode, all threads, seconds */
  double system_seconds;  /* CPU time in the kernel on the process's behalf, seconds */
} ddp_os_rusage;

/* Fill *out with the process's resource usage. DDP_ERR_ARG when out is NULL; DDP_ERR_IO
 * when the OS refuses (naming the reason). */
int ddp_os_resource_usage(ddp_os_rusage *out);

/* 1 when the n bytes at a and b are equal (memcmp), else 0. n = 0 gives 1. For bitwise
 * comparisons of tensor data from Lua (`ddplua verify`). */
int ddp_os_bytes_equal(const void *a, const void *b, size_t n);
