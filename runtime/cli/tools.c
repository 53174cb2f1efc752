/* runtime/cli/tools.c: subcommands written in Lua. `ddplua <tool> args...` loads the module
 * ddplua.tools.<tool> and calls its main(args) with the arguments as a Lua list; main
 * returns the exit status (a number; nil means 0). Errors are reported as for scripts
 * (message and traceback on stderr, exit status 1). */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

enum { TOOL_PATH_BUF = 4096 };

int ddp_cli_run_lua_tool(int argc, char **argv) {
  char root[TOOL_PATH_BUF], module[256];
  ddp_cli_root(root, sizeof root);
  lua_State *L = ddp_host_new(root, argc, argv, 0);
  if (!L) return DDP_CLI_EXIT_ERROR;
  snprintf(module, sizeof module, "ddplua.tools.%s", argv[0]);
  lua_getglobal(L, "require");
  lua_pushstring(L, module);
  int status = ddp_host_call(L, 1, 1);
  if (status == 0) {
    lua_getfield(L, -1, "main");
    lua_createtable(L, argc - 1, 0);
    for (int i = 1; i < argc; i++) {
      lua_pushstring(L, argv[i]);
      lua_rawseti(L, -2, i);
    }
    status = ddp_host_call(L, 1, 1);
  }
  int code;
  if (status != 0) {
    ddp_host_report(L, status);
    code = DDP_CLI_EXIT_ERROR;
  } else {
    code = lua_isnumber(L, -1) ? (int)lua_tointeger(L, -1) : DDP_CLI_EXIT_OK;
  }
  fflush(stdout);
  lua_close(L);
  return code;
}
