/* repl.c: the read-eval-print loop of the ddplua executable.
 *
 * As the stock lua REPL: a line is first tried as an expression ("return " .. line) and its
 * results printed with the global print (tab-separated; tensors through their __tostring
 * summary); otherwise it is run as a statement. Input that fails to compile only because it
 * ended early (the syntax error ends in '<eof>') is continued on the next line with the ">> "
 * prompt. Errors are reported with a traceback and the loop goes on; end of input ends it.
 *
 * On a terminal, lines come from libedit (line editing, history kept in ~/.ddplua_history;
 * failures to read or write it are ignored) and a banner is printed. From a pipe, lines come
 * from fgets and only the prompts are printed, so a driven session is predictable.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <editline/readline.h>
#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>

#include "cli.h"
#include "ddplua.h"

#define PROMPT "> "
#define PROMPT_MORE ">> "
#define CHUNK_NAME "=stdin"
#define HISTORY_FILE ".ddplua_history"
#define HISTORY_MAX 1000

/* ---------------------------------------------------------------------------------------
 * Reading lines
 * ------------------------------------------------------------------------------------- */

/* A growable text buffer (the current, possibly multi-line, input). */
typedef struct text {
  char *data;
  size_t len, cap;
} text;

static int text_append(text *t, const char *s, size_t n) {
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + n + 1) cap *= 2;
    char *grown = realloc(t->data, cap);
    if (!grown) return -1;
    t->data = grown;
    t->cap = cap;
  }
  memcpy(t->data + t->len, s, n);
  t->len += n;
  t->data[t->len] = '\0';
  return 0;
}

typedef struct reader {
  int tty;
  int interrupted;    /* the last read_line ended with Ctrl-C */
  char history[4096]; /* path of the history file, "" when $HOME is unset */
} reader;

/* Set by Ctrl-C while libedit waits for a line. The handler is installed without SA_RESTART
 * so that the read under readline() fails with EINTR and readline() returns NULL. */
static volatile sig_atomic_t prompt_interrupted;

static void on_prompt_sigint(int sig) {
  (void)sig;
  prompt_interrupted = 1;
}

/* Read one line without its newline into a malloc'd string. NULL at end of input, or after
 * Ctrl-C at the prompt (then r->interrupted is set). */
static char *read_line(reader *r, const char *prompt) {
  r->interrupted = 0;
  if (r->tty) {
    prompt_interrupted = 0;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prompt_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    char *line = readline(prompt);
    sigaction(SIGINT, &old, NULL);
    if (!line && prompt_interrupted) { /* Ctrl-C: drop the input, as a shell does */
      fputs("\n", stdout);
      r->interrupted = 1;
    }
    if (line && *line) add_history(line);
    return line;
  }
  fputs(prompt, stdout);
  fflush(stdout);
  text t = {0};
  char chunk[1024];
  while (fgets(chunk, sizeof chunk, stdin)) {
    size_t n = strlen(chunk);
    if (text_append(&t, chunk, n) != 0) break;
    if (n > 0 && chunk[n - 1] == '\n') break;
  }
  if (t.len == 0 && (feof(stdin) || ferror(stdin))) {
    free(t.data);
    return NULL;
  }
  if (t.len > 0 && t.data[t.len - 1] == '\n') t.data[--t.len] = '\0';
  if (!t.data) return strdup("");
  return t.data;
}

static void reader_open(reader *r, int tty) {
  r->tty = tty;
  r->history[0] = '\0';
  if (!tty) return;
  rl_readline_name = DDP_CLI_NAME;
  using_history();
  stifle_history(HISTORY_MAX);
  const char *home = getenv("HOME");
  if (home && *home) {
    snprintf(r->history, sizeof r->history, "%s/" HISTORY_FILE, home);
    read_history(r->history); /* a missing or unreadable file is not an error */
  }
}

static void reader_close(reader *r) {
  if (r->tty && r->history[0]) write_history(r->history); /* failures ignored on purpose */
}

/* ---------------------------------------------------------------------------------------
 * Evaluating
 * ------------------------------------------------------------------------------------- */

/* Is the error on top of the stack (from loading) the parser meeting the end of the input
 * too early? Then pop it: more lines may complete the chunk. */
static int incomplete(lua_State *L, int status) {
  static const char eof_mark[] = "'<eof>'";
  const size_t mark_len = sizeof eof_mark - 1;
  if (status != LUA_ERRSYNTAX) return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  if (msg && len >= mark_len && strcmp(msg + len - mark_len, eof_mark) == 0) {
    lua_pop(L, 1);
    return 1;
  }
  return 0;
}

/* Try `line` as an expression list (a leading '=' as in Lua 5.1 is allowed). The line goes
 * in as the arguments of an identity function rather than after a bare "return": LuaJIT
 * turns `return f(...)` into a tail call, which drops the chunk's frame, so `error("boom")`
 * would lose its "stdin:1:" position and traceback. An argument list takes exactly the
 * expression lists `return` does and keeps every value (nil included). The newline keeps a
 * trailing comment from swallowing the ')'. Leaves the compiled chunk on the stack and
 * returns 0, or returns non-zero with nothing. */
static int load_expression(lua_State *L, const char *line) {
  if (line[0] == '=') line++;
  lua_pushfstring(L, "return (function(...) return ... end)(%s\n)", line);
  const char *code = lua_tostring(L, -1);
  int status = luaL_loadbuffer(L, code, strlen(code), CHUNK_NAME);
  lua_remove(L, -2); /* the code string */
  if (status != 0) lua_pop(L, 1);
  return status;
}

/* read_chunk's results besides the lua_load statuses. */
enum { CHUNK_EOF = -1, CHUNK_NONE = -2 };

/* Read and compile one input (an expression, or a statement over as many lines as it needs).
 * Returns: 0 with the chunk on the stack; a load error status with its message on the stack;
 * CHUNK_EOF at end of input or CHUNK_NONE after Ctrl-C (nothing on the stack). */
static int read_chunk(lua_State *L, reader *r) {
  char *line = read_line(r, PROMPT);
  if (!line) return r->interrupted ? CHUNK_NONE : CHUNK_EOF;
  if (load_expression(L, line) == 0) {
    free(line);
    return 0;
  }
  text buf = {0};
  int status = 0, oom = text_append(&buf, line, strlen(line));
  free(line);
  while (!oom) {
    status = luaL_loadbuffer(L, buf.data, buf.len, CHUNK_NAME);
    if (!incomplete(L, status)) break;
    line = read_line(r, PROMPT_MORE);
    if (!line && r->interrupted) {
      free(buf.data);
      return CHUNK_NONE;
    }
    if (!line) { /* end of input inside a statement: report the error it has now */
      status = luaL_loadbuffer(L, buf.data, buf.len, CHUNK_NAME);
      break;
    }
    oom = text_append(&buf, "\n", 1) || text_append(&buf, line, strlen(line));
    free(line);
  }
  free(buf.data);
  if (oom) {
    lua_pushliteral(L, "out of memory");
    return LUA_ERRMEM;
  }
  return status;
}

/* Print what the chunk returned (the values above `base`) with the global print. */
static void print_results(lua_State *L, int base) {
  int n = lua_gettop(L) - base;
  if (n <= 0) return;
  lua_getglobal(L, "print");
  lua_insert(L, base + 1);
  int status = lua_pcall(L, n, 0, 0);
  if (status != 0) {
    lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1));
    lua_remove(L, -2);
    ddp_host_report(L, status);
  }
  fflush(stdout);
}

static void banner(void) {
  printf(DDP_CLI_NAME " %s (%s). `dl` is require \"ddplua\"; Ctrl-D exits.\n", ddp_version(),
         LUAJIT_VERSION);
}

int ddp_repl_run(lua_State *L, int tty) {
  reader r;
  reader_open(&r, tty);
  if (tty) banner();
  lua_settop(L, 0);
  ddp_host_require(L, "dl", "ddplua"); /* a failure is reported; plain Lua still works */
  for (;;) {
    int status = read_chunk(L, &r);
    if (status == CHUNK_EOF) break;
    if (status == CHUNK_NONE) continue;
    if (status == 0) {
      status = ddp_host_call(L, 0, LUA_MULTRET);
      if (status == 0) print_results(L, 0);
    }
    ddp_host_report(L, status);
    lua_settop(L, 0);
  }
  fputs("\n", stdout);
  fflush(stdout);
  reader_close(&r);
  return DDP_CLI_EXIT_OK;
}
