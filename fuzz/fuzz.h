/* fuzz/fuzz.h: what the libFuzzer targets share (Note [fuzz targets], tools/fuzz.sh).
 *
 * Note [fuzz targets]
 * Each fuzz/<name>.c defines LLVMFuzzerTestOneInput and calls the SAME function the
 * runtime calls on outside bytes (a parser taking (data, size), factored out of the file or
 * socket code: no test hooks in shipping code). It links the runtime's objects built with
 * clang -fsanitize=fuzzer-no-link,address,undefined in build-fuzz/ (Makefile, `make fuzz`),
 * and checks, beyond "no crash, no leak, no undefined behaviour", the parser's contract:
 * a failure leaves an error message that names the input, a success returns results
 * consistent with the bytes. Seeds are in fuzz/corpus/<name>/ (fuzz/make_corpus.lua makes
 * them), a dictionary, when useful, in fuzz/<name>.dict. A new parser of outside bytes
 * gets a target by adding fuzz/<name>.c and fuzz/corpus/<name>/: tools/fuzz.sh finds every
 * fuzz/<name>.c by itself. A finding is fixed in the parser, with a spec, and its input is kept
 * in the corpus.
 */
#ifndef DDP_FUZZ_H
#define DDP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddplua.h"

/* A broken contract: print it and abort (libFuzzer saves the input as a crash). */
#define FUZZ_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* A failed call must leave a message that names `name` (the file the bytes stand for). */
static inline void fuzz_check_error(int status, const char *name) {
  const char *msg = ddp_last_error();
  FUZZ_CHECK(status != 0, "status %d", status);
  FUZZ_CHECK(msg && strstr(msg, name), "the error does not name '%s': %s", name, msg ? msg : "(null)");
}

#endif
