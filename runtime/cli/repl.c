/* repl.c: the read-eval-print loop of the ddplua executable.
 *
 * The lines are read here; what they mean is decided by the Lua module ddplua.repl
 * (lua/ddplua/repl/): its session compiles each input (expressions and a trailing expression
 * printed, locals kept from line to line, `?name` help, `:time expr`) or asks for more lines
 * (">> " prompt); this file runs what it compiled under ddp_host_call (traceback, Ctrl-C)
 * and prints the results with the global print (tab-separated; tensors through their
 * __tostring summary). Errors are reported and the loop goes on; only end of input (Ctrl-D)
 * ends it: Ctrl-C at the prompt drops the line, Ctrl-C while code runs interrupts the code.
 * Should ddplua.repl fail to load, a plain evaluator (as the stock lua REPL: expression,
 * else statement) keeps the prompt usable.
 *
 * Tab completion (libedit) asks the session for candidates: globals, fields, methods
 * through metatables, module names in require strings (ddplua.repl.complete).
 *
 * On a terminal, lines come from libedit (line editing, history kept in ~/.ddplua_history;
 * failures to read or write it are ignored) and a banner is printed. From a pipe, lines come
 * from fgets and only the prompts are printed, so a driven session is predictable.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Note [Ctrl-C at the prompt]
 * Ctrl-C while libedit waits for a line drops the line, as a shell does. A flag set by the
 * handler alone is not enough: a Ctrl-C that arrives while libedit is busy (redrawing after
 * a Tab, say) would not interrupt the next read, and the prompt would sit there until the
 * next key. So the handler also writes a byte into a pipe (the self-pipe trick), and
 * libedit reads its characters through wait_key, which polls the terminal and that pipe:
 * once the flag is up it hands libedit a newline, which ends the line; read_line then sees
 * the flag and throws the line away. */
static volatile sig_atomic_t prompt_interrupted;
static int wake_pipe[2] = {-1, -1};

static void on_prompt_sigint(int sig) {
  (void)sig;
  int saved = errno;
  prompt_interrupted = 1;
  if (wake_pipe[1] >= 0) (void)!write(wake_pipe[1], "", 1);
  errno = saved;
}

/* libedit's character source (rl_getc_function): one byte of the terminal, or a newline
 * once Ctrl-C was pressed; EOF (-1) at end of input. */
static int wait_key(FILE *in) {
  int fd = fileno(in);
  for (;;) {
    if (prompt_interrupted) return '\n';
    struct pollfd p[2] = {{fd, POLLIN, 0}, {wake_pipe[0], POLLIN, 0}};
    int n = poll(p, wake_pipe[0] >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (wake_pipe[0] >= 0 && (p[1].revents & POLLIN)) {
      char drain[64];
      (void)!read(wake_pipe[0], drain, sizeof drain);
      continue;
    }
    unsigned char c;
    ssize_t got = read(fd, &c, 1);
    if (got == 1) return c;
    if (got < 0 && errno == EINTR) continue;
    return -1;
  }
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
    if (prompt_interrupted) { /* Ctrl-C: drop the input (Note [Ctrl-C at the prompt]) */
      if (!line) fputs("\n", stdout);
      free(line);
      line = NULL;
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
  if (wake_pipe[0] < 0 && pipe(wake_pipe) == 0) {
    fcntl(wake_pipe[0], F_SETFL, O_NONBLOCK);
    fcntl(wake_pipe[1], F_SETFL, O_NONBLOCK);
    fcntl(wake_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(wake_pipe[1], F_SETFD, FD_CLOEXEC);
  }
  rl_getc_function = wait_key;
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

/* The plain evaluator (when ddplua.repl is missing): read and compile one input (an
 * expression, or a statement over as many lines as it needs). Returns: 0 with the chunk on
 * the stack; a load error status with its message on the stack; CHUNK_EOF at end of input
 * or CHUNK_NONE after Ctrl-C (nothing on the stack). */
static int read_chunk_plain(lua_State *L, reader *r) {
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

/* ---------------------------------------------------------------------------------------
 * The session (ddplua.repl)
 * ------------------------------------------------------------------------------------- */

/* The session object (a registry reference, LUA_NOREF without ddplua.repl) and its state,
 * for the completion callback, which libedit calls with no context. */
static int session_ref = LUA_NOREF;
static lua_State *session_state;

/* Push session[method] and the session (for a method call). */
static void push_method(lua_State *L, const char *method) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, session_ref);
  lua_getfield(L, -1, method);
  lua_insert(L, -2);
}

/* `repl = require "ddplua.repl"; session = repl.new(); help = repl.help` (a global, as `dl`).
 * Returns 0, or non-zero after reporting why (then the plain evaluator is used). */
static int session_open(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ddplua.repl");
  int status = ddp_host_call(L, 1, 1);
  if (status != 0) return ddp_host_report(L, status);
  lua_getfield(L, -1, "help");
  lua_setglobal(L, "help");
  lua_getfield(L, -1, "new");
  lua_remove(L, -2);
  status = ddp_host_call(L, 0, 1);
  if (status != 0) return ddp_host_report(L, status);
  session_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  session_state = L;
  return 0;
}

/* Longest common prefix of the n strings in m[1..n], malloc'd. */
static char *common_prefix(char **m, size_t n) {
  size_t len = strlen(m[1]);
  for (size_t i = 2; i <= n; i++) {
    size_t k = 0;
    while (k < len && m[i][k] == m[1][k]) k++;
    len = k;
  }
  char *p = malloc(len + 1);
  if (p) {
    memcpy(p, m[1], len);
    p[len] = '\0';
  }
  return p;
}

/* libedit's completion callback: the session's candidates for the word line[start, end)
 * (session:complete(line, start + 1, end) in Lua's 1-based positions). In readline's format:
 * [0] what replaces the word now (the common prefix), then the candidates, then NULL;
 * libedit lists them on a second Tab. Never falls back to file names. */
static char **complete_word(const char *text, int start, int end) {
  (void)text;
  rl_attempted_completion_over = 1;
  lua_State *L = session_state;
  if (!L || session_ref == LUA_NOREF) return NULL;
  int top = lua_gettop(L);
  char **m = NULL;
  push_method(L, "complete");
  lua_pushstring(L, rl_line_buffer);
  lua_pushinteger(L, start + 1);
  lua_pushinteger(L, end);
  if (lua_pcall(L, 4, 1, 0) == 0 && lua_istable(L, -1)) {
    size_t n = lua_objlen(L, -1), k = 0;
    m = n ? calloc(n + 2, sizeof *m) : NULL;
    for (size_t i = 1; m && i <= n; i++) {
      lua_rawgeti(L, -1, (int)i);
      const char *word = lua_tostring(L, -1);
      if (word && (m[k + 1] = strdup(word))) k++;
      lua_pop(L, 1);
    }
    if (m && k > 0 && (m[0] = common_prefix(m, k))) {
      /* keep the list */
    } else if (m) {
      for (size_t i = 1; i <= k; i++) free(m[i]);
      free(m);
      m = NULL;
    }
  }
  lua_settop(L, top);
  return m;
}

/* Where complete inputs go instead of being run here (ddp_repl_set_remote). */
static ddp_repl_remote remote_run;
static void *remote_ctx;

void ddp_repl_set_remote(ddp_repl_remote run, void *ctx) {
  remote_run = run;
  remote_ctx = ctx;
}

/* Length of a leading "%rank K " (the distributed REPL's one-rank form), else 0. */
static size_t rank_prefix(const char *s) {
  if (strncmp(s, "%rank", 5) != 0) return 0;
  size_t i = 5;
  while (s[i] == ' ') i++;
  size_t digits = i;
  while (s[i] >= '0' && s[i] <= '9') i++;
  if (i == digits) return 0;
  while (s[i] == ' ') i++;
  return i;
}

/* Read and compile one input through the session. Returns 0 with the function and its
 * arguments on the stack (*nargs set) and, when `source` is given, the input's text in
 * *source (malloc'd); a load error status with its message on the stack; CHUNK_EOF or
 * CHUNK_NONE as read_chunk_plain. */
static int read_chunk(lua_State *L, reader *r, int *nargs, char **source) {
  *nargs = 0;
  if (source) *source = NULL;
  char *line = read_line(r, PROMPT);
  if (!line) return r->interrupted ? CHUNK_NONE : CHUNK_EOF;
  text buf = {0};
  int status, oom = text_append(&buf, line, strlen(line));
  free(line);
  for (;;) {
    lua_settop(L, 0);
    if (oom) {
      lua_pushliteral(L, "out of memory");
      status = LUA_ERRMEM;
      break;
    }
    size_t skip = source ? rank_prefix(buf.data) : 0;
    push_method(L, "compile");
    lua_pushlstring(L, buf.data + skip, buf.len - skip);
    status = lua_pcall(L, 2, LUA_MULTRET, 0);
    if (status != 0) break;
    const char *kind = lua_tostring(L, 1);
    if (kind && strcmp(kind, "run") == 0) {
      lua_remove(L, 1);
      *nargs = lua_gettop(L) - 1;
      if (source) {
        *source = buf.data;
        return 0;
      }
      break;
    }
    if (!kind || strcmp(kind, "more") != 0) { /* "error": its message */
      lua_settop(L, 2);
      lua_remove(L, 1);
      status = LUA_ERRSYNTAX;
      break;
    }
    lua_settop(L, 0);
    line = read_line(r, PROMPT_MORE);
    if (!line && r->interrupted) {
      status = CHUNK_NONE;
      break;
    }
    if (!line) { /* end of input inside a statement: report the error it has now */
      status = luaL_loadbuffer(L, buf.data, buf.len, CHUNK_NAME);
      if (status == 0) lua_pop(L, 1);
      break;
    }
    oom = text_append(&buf, "\n", 1) || text_append(&buf, line, strlen(line));
    free(line);
  }
  free(buf.data);
  return status;
}

int ddp_repl_eval(lua_State *L, const char *code, size_t len) {
  lua_settop(L, 0);
  int status;
  if (session_ref == LUA_NOREF) {
    status = luaL_loadbuffer(L, code, len, CHUNK_NAME);
    if (status == 0) status = ddp_host_call(L, 0, LUA_MULTRET);
  } else {
    push_method(L, "compile");
    lua_pushlstring(L, code, len);
    status = lua_pcall(L, 2, LUA_MULTRET, 0);
    const char *kind = status == 0 ? lua_tostring(L, 1) : NULL;
    if (kind && strcmp(kind, "run") == 0) {
      lua_remove(L, 1);
      status = ddp_host_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    } else if (kind) { /* "error" (or "more": an input cut short) */
      lua_settop(L, 0);
      status = luaL_loadbuffer(L, code, len, CHUNK_NAME);
      if (status == 0) {
        lua_pop(L, 1);
        lua_pushliteral(L, "incomplete input");
        status = LUA_ERRSYNTAX;
      }
    }
  }
  if (status == 0) print_results(L, 0);
  ddp_host_report(L, status);
  lua_settop(L, 0);
  return status;
}

static void banner(void) {
  printf(DDP_CLI_NAME " %s (%s). `dl` is require \"ddplua\"; ?name shows help, Tab completes;"
         " Ctrl-D exits.\n", ddp_version(), LUAJIT_VERSION);
}

int ddp_repl_run(lua_State *L, int tty) {
  reader r;
  reader_open(&r, tty);
  if (tty && !remote_run) banner();
  lua_settop(L, 0);
  ddp_host_require(L, "dl", "ddplua"); /* a failure is reported; plain Lua still works */
  int with_session = session_open(L) == 0;
  lua_settop(L, 0);
  if (tty && with_session) {
    rl_attempted_completion_function = complete_word;
    rl_completer_word_break_characters = " \t\n\"'`><=;|&{}()[],+-*/%^~#";
    rl_completion_append_character = '\0';
  }
  const char *serve = getenv("DDPLUA_REPL_CONNECT");
  if (serve && *serve && with_session && !remote_run) { /* a rank of the distributed REPL */
    int status = ddp_repl_serve(L, serve);
    reader_close(&r);
    return status;
  }
  ddp_host_keep_running_on_sigint(1);
  for (;;) {
    int nargs = 0;
    char *source = NULL;
    int remote = with_session && remote_run;
    int status = with_session ? read_chunk(L, &r, &nargs, remote ? &source : NULL)
                              : read_chunk_plain(L, &r);
    if (status == CHUNK_EOF) break;
    if (status == CHUNK_NONE) continue;
    if (status == 0 && source) {
      lua_settop(L, 0);
      remote_run(remote_ctx, source, strlen(source));
      free(source);
      continue;
    }
    if (status == 0) {
      status = ddp_host_call(L, nargs, LUA_MULTRET);
      if (status == 0) print_results(L, 0);
    }
    ddp_host_report(L, status);
    lua_settop(L, 0);
  }
  ddp_host_keep_running_on_sigint(0);
  fputs("\n", stdout);
  fflush(stdout);
  reader_close(&r);
  return DDP_CLI_EXIT_OK;
}
