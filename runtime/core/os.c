/* runtime/core/os.c: the OS services of ddplua/os.h (clock, terminals, folders, resource
 * usage, byte comparison, sleep). Core is the bottom layer: this file includes libc/POSIX headers
 * and core/core.h only. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

double ddp_os_monotonic_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ddp_os_wall_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ddp_os_isatty(int fd) { return isatty(fd) == 1; }

int ddp_os_sleep(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9)
    DDP_FAIL(DDP_ERR_ARG, "sleep: seconds must be a number in 0 .. 1e9, got %g", seconds);
  // An absolute deadline on the monotonic clock: a signal handler that interrupts the sleep
  // (EINTR) costs nothing, the next call sleeps only what is left.
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  double whole = (double)(time_t)seconds;
  until.tv_sec += (time_t)whole;
  until.tv_nsec += (long)((seconds - whole) * 1e9);
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec += 1;
    until.tv_nsec -= 1000000000L;
  }
  int err;
  while ((err = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL)) == EINTR) {}
  if (err) DDP_FAIL(DDP_ERR_IO, "sleep: clock_nanosleep failed: %s", strerror(err));
  return DDP_OK;
}

// Make one folder; an existing folder counts as made (another process may race us to it).
static int make_one(const char *dir) {
  if (mkdir(dir, 0777) == 0) return 0;
  int err = errno;
  struct stat st;
  if (err == EEXIST && stat(dir, &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  return err;
}

int ddp_os_mkdir_p(const char *path) {
  if (!path || !path[0]) DDP_FAIL(DDP_ERR_ARG, "mkdir -p: the path is empty");
  size_t n = strlen(path);
  char *buf = malloc(n + 1);
  if (!buf) DDP_FAIL(DDP_ERR_MEMORY, "mkdir -p '%s': out of memory", path);
  memcpy(buf, path, n + 1);
  // Each parent in turn: cut the path at every '/' after the first character.
  for (size_t i = 1; i <= n; i++) {
    if (i < n && buf[i] != '/') continue;
    if (buf[i - 1] == '/') continue; // "a//b": the empty component is the same folder
    char saved = buf[i];
    buf[i] = 0;
    int err = make_one(buf);
    if (err) {
      int status = ddp_fail_at(__FILE__, __LINE__, DDP_ERR_IO, "mkdir -p '%s': cannot create '%s': %s",
                               path, buf, strerror(err));
      free(buf);
      return status;
    }
    buf[i] = saved;
  }
  free(buf);
  return DDP_OK;
}

int ddp_os_resource_usage(ddp_os_rusage *out) {
  if (!out) DDP_FAIL(DDP_ERR_ARG, "resource_usage: out is NULL");
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) DDP_FAIL(DDP_ERR_IO, "resource_usage: getrusage failed: %s", strerror(errno));
  out->peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024; // Linux reports kilobytes
  out->user_seconds = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6;
  out->system_seconds = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
  return DDP_OK;
}

int ddp_os_bytes_equal(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

int ddp_os_list_dir(const char *path, char *buf, size_t cap, size_t *needed) {
  if (!path || !needed) DDP_FAIL(DDP_ERR_ARG, "list_dir: path and needed must not be NULL");
  *needed = 0;
  DIR *d = opendir(path);
  if (!d) DDP_FAIL(DDP_ERR_IO, "list_dir: cannot open folder %s: %s", path, strerror(errno));
  size_t total = 0, plen = strlen(path);
  int status = DDP_OK;
  for (;;) {
    errno = 0;
    struct dirent *e = readdir(d);
    if (!e) {
      if (errno) status = DDP_ERROR(DDP_ERR_IO, "list_dir: cannot read folder %s: %s", path, strerror(errno));
      break;
    }
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    size_t nlen = strlen(e->d_name);
    char *full = malloc(plen + nlen + 2);
    if (!full) {
      status = DDP_ERROR(DDP_ERR_MEMORY, "list_dir: out of memory");
      break;
    }
    snprintf(full, plen + nlen + 2, "%s/%s", path, e->d_name);
    struct stat st;
    char type = 'o';
    if (stat(full, &st) == 0) type = S_ISDIR(st.st_mode) ? 'd' : S_ISREG(st.st_mode) ? 'f' : 'o';
    free(full);
    if (buf && total + nlen + 2 <= cap) {
      buf[total] = type;
      memcpy(buf + total + 1, e->d_name, nlen + 1);
    }
    total += nlen + 2;
  }
  closedir(d);
  if (status) return status;
  *needed = total;
  if (total > cap)
    DDP_FAIL(DDP_ERR_ARG, "list_dir: %s needs a buffer of %zu bytes, got %zu", path, total, cap);
  return DDP_OK;
}
