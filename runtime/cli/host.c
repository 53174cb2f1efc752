/* host.c: the Lua state of the ddplua executable.
 *
 * Creates the state, points package.path at the project's lua/ folder, builds the global
 * `arg` as the stock luajit does, and runs chunks in protected mode with a traceback and
 * Ctrl-C handling. Errors are reported on stderr as "ddplua: <message>".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "cli.h"
#include "ddplua.h"

/* ---------------------------------------------------------------------------------------
 * Where the executable lives
 * ------------------------------------------------------------------------------------- */

/* Cut `path` at its last '/' (keeps "/" for a top-level entry). Returns 0, or -1 if none. */
static int strip_last(char *path) {
  char *slash = strrchr(path, '/');
  if (!slash) return -1;
  if (slash == path) slash[1] = '\0';
  else *slash = '\0';
  return 0;
}

int ddp_cli_exe_dir(char *buf, size_t size) {
  ssize_t n = readlink("/proc/self/exe", buf, size - 1);
  if (n <= 0 || (size_t)n >= size - 1) {
    snprintf(buf, size, ".");
    return -1;
  }
  buf[n] = '\0';
  return strip_last(buf);
}

int ddp_cli_root(char *buf, size_t size) {
  if (ddp_cli_exe_dir(buf, size) != 0 || strip_last(buf) != 0) {
    snprintf(buf, size, ".");
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------
 * Creating the state
 * ------------------------------------------------------------------------------------- */

/* Runs inside lua_cpcall so that an out-of-memory error while setting up is caught. */
typedef struct host_setup {
  const char *root;
  int argc;
  char **argv;
  int script;
} host_setup;

static int setup(lua_State *L) {
  const host_setup *s = lua_touserdata(L, 1);
  lua_gc(L, LUA_GCSTOP, 0); /* as luajit.c: no collections while opening the libraries */
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);

  /* package.path: <root>/lua first, so `require "ddplua"` finds this build's front end from
   * any directory; then ./ for the user's own modules; then what LUA_PATH or the default
   * gave. */
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;./?.lua;./?/init.lua;%s", s->root, s->root,
                  lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);

  /* arg: arg[i - script] = argv[i]; with no script, the executable is arg[0]. */
  int base = s->script;
  lua_createtable(L, s->argc - base > 0 ? s->argc - base : 0, base + 1);
  for (int i = 0; i < s->argc; i++) {
    lua_pushstring(L, s->argv[i]);
    lua_rawseti(L, -2, i - base);
  }
  lua_setglobal(L, "arg");
  return 0;
}

lua_State *ddp_host_new(const char *root, int argc, char **argv, int script) {
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, DDP_CLI_NAME ": cannot create the Lua state: not enough memory\n");
    return NULL;
  }
  host_setup s = {root, argc, argv, script};
  if (ddp_host_report(L, lua_cpcall(L, setup, &s)) != 0) {
    lua_close(L);
    return NULL;
  }
  return L;
}

/* ---------------------------------------------------------------------------------------
 * Protected calls: traceback and Ctrl-C
 * ------------------------------------------------------------------------------------- */

/* The state a Ctrl-C interrupts (one Lua state per process). */
static lua_State *interrupted_state;
static double error_at; /* when the last Lua error was raised (ddp_os_monotonic_seconds) */
/* Set by the REPL: every Ctrl-C interrupts the running code, none ends the process. */
static int keep_running_on_sigint;

/* The hook set by the signal handler: clears itself and raises at the next Lua event. Code
 * that runs as a JIT trace or inside a C function only notices at the next call or return
 * (the REPL keeps what is typed at the prompt out of the JIT: Note [interruptible input] in
 * lua/ddplua/repl/chunk.lua). Outside the REPL a second Ctrl-C (default action restored)
 * ends the process. */
static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}

/* lua_sethook is the one Lua call that is safe in a signal handler (it only stores the hook
 * and its mask; the stock luajit does the same). */
static void on_sigint(int sig) {
  if (!keep_running_on_sigint) signal(sig, SIG_DFL);
  lua_sethook(interrupted_state, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

void ddp_host_keep_running_on_sigint(int on) { keep_running_on_sigint = on; }

/* Message handler: turn the error into "<message>\nstack traceback:..." (through the error
 * object's __tostring when it is not a string). */
static int traceback(lua_State *L) {
  error_at = ddp_os_monotonic_seconds(); /* before unwinding closes anything */
  if (!lua_isstring(L, 1)) {
    if (lua_isnoneornil(L, 1) || !luaL_callmeta(L, 1, "__tostring") || !lua_isstring(L, -1)) {
      lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    lua_replace(L, 1);
    lua_settop(L, 1);
  }
  lua_getglobal(L, "debug");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return 1; }
  lua_getfield(L, -1, "traceback");
  if (!lua_isfunction(L, -1)) { lua_pop(L, 2); return 1; }
  lua_pushvalue(L, 1);
  lua_pushinteger(L, 2); /* skip this handler */
  lua_call(L, 2, 1);
  return 1;
}

int ddp_host_call(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  interrupted_state = L;
  /* sigaction rather than signal(): System V semantics would reset the handler after one
   * Ctrl-C even in the REPL. */
  struct sigaction sa, previous;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &previous);
  int status = lua_pcall(L, nargs, nresults, base);
  sigaction(SIGINT, &previous, NULL);
  lua_sethook(L, NULL, 0, 0); /* in case Ctrl-C came after the last Lua event */
  lua_remove(L, base);
  if (status != 0) lua_gc(L, LUA_GCCOLLECT, 0); /* an error may leave big garbage behind */
  return status;
}

/* Tell the launcher (when one started us) that this worker fails, and since when (Note
 * [first failure] in ddplua/process.h): the script's error ends the worker. */
static int fatal(lua_State *L, int status) {
  if (status != 0) {
    size_t len = 0;
    const char *msg = lua_tolstring(L, -1, &len);
    ddp_process_report_failure(error_at, msg ? msg : "", msg ? len : 0);
  }
  return ddp_host_report(L, status);
}

int ddp_host_report(lua_State *L, int status) {
  if (status == 0) return 0;
  const char *msg = lua_tostring(L, -1);
  if (!msg) msg = "(error object is not a string)";
  fflush(stdout); /* keep the order of earlier output when both go to one pipe */
  fprintf(stderr, DDP_CLI_NAME ": %s\n", msg);
  fflush(stderr);
  lua_pop(L, 1);
  return status;
}

/* ---------------------------------------------------------------------------------------
 * Running code
 * ------------------------------------------------------------------------------------- */

int ddp_host_dostring(lua_State *L, const char *code, const char *name) {
  int status = luaL_loadbuffer(L, code, strlen(code), name);
  if (status == 0) status = ddp_host_call(L, 0, 0);
  return fatal(L, status);
}

int ddp_host_require(lua_State *L, const char *global, const char *module) {
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  int status = ddp_host_call(L, 1, 1);
  if (status == 0) lua_setglobal(L, global);
  return fatal(L, status);
}

int ddp_host_run_script(lua_State *L, int argc, char **argv, int script) {
  const char *path = argv[script];
  int from_stdin = strcmp(path, "-") == 0;
  /* luaL_loadfile(NULL) reads stdin; "--" before "-" would make "-" a file name, but such a
   * file is rare enough that stdin is what is meant. */
  int status = luaL_loadfile(L, from_stdin ? NULL : path);
  if (status == 0) {
    int nargs = argc - script - 1;
    luaL_checkstack(L, nargs + 3, "too many arguments to the script");
    for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
    status = ddp_host_call(L, nargs, 0);
  }
  return fatal(L, status);
}
