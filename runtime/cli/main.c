/* main.c: entry point of the ddplua executable (DESIGN.md, runtime/cli).
 *
 *   ddplua script.lua args...       run a script
 *   ddplua -e 'code' ...            run code given on the command line
 *   ddplua [-i script.lua]          REPL (also after a script with -i)
 *   ddplua -                        script from stdin
 *   ddplua --version | --help
 *   ddplua --nproc_per_node=N [launcher flags] script.lua args...   the launcher (launcher.c)
 *   ddplua --nproc_per_node=N -i   one prompt, a REPL on every rank (dist_repl.c)
 *   ddplua <subcommand> ...         tools built into the executable (table below)
 *
 * Order: a subcommand named by argv[1] takes the whole command line; otherwise the options
 * are parsed (args.c), then -e / -l run in order, then the script, then the REPL when asked
 * for (-i) or when there was nothing else to run.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lua.h>
#include <luajit.h>

#include "cli.h"
#include "ddplua.h"

#define PATH_BUF 4096

/* A subcommand: `ddplua <name> args...` calls run(argc, argv) with argv[0] = name and
 * returns its exit status. Subcommands win over a script of the same name; a script named
 * like one can still be run as ./name or with `--`. */
typedef struct subcommand {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} subcommand;

static const subcommand subcommands[] = {
  {"prepare", ddp_cli_run_lua_tool, "tokenize text files into train.bin / val.bin (nanoGPT's token files) and meta.json"},
  {"sample", ddp_cli_run_lua_tool, "print text sampled from a language model train.lua trained (--checkpoint DIR --start TEXT)"},
  {"plot", ddp_cli_run_lua_tool, "plot loss and accuracy of runs/<name> to a PNG (gnuplot)"},
  {"verify", ddp_cli_run_lua_tool, "compare replica checkpoints (safetensors) tensor by tensor; exit 1 if any differ"},
  {"trace", ddp_cli_run_lua_tool, "profiler traces: merge DIR (ranks on one timeline), summary FILE, plot FILE OUT.png"},
  {NULL, NULL, NULL},
};

static const subcommand *find_subcommand(const char *name) {
  for (const subcommand *s = subcommands; s->name; s++)
    if (strcmp(s->name, name) == 0) return s;
  return NULL;
}

static void print_version(void) {
  printf(DDP_CLI_NAME " %s (%s)\n", ddp_version(), LUAJIT_VERSION);
}

/* The executable uses the runtime it was linked with (rpath $ORIGIN): tell the Lua side
 * (lua/ddplua/lib.lua reads $DDPLUA_LIB) to ffi.load that same file unless the user chose
 * one, so a build-sanitize/ddplua never mixes in build/libddplua.so. Children (launcher
 * workers) inherit the choice. */
static void point_lua_at_own_runtime(void) {
  char dir[PATH_BUF], lib[PATH_BUF + 32];
  if (getenv("DDPLUA_LIB") || ddp_cli_exe_dir(dir, sizeof dir) != 0) return;
  snprintf(lib, sizeof lib, "%s/libddplua.so", dir);
  if (access(lib, R_OK) == 0) setenv("DDPLUA_LIB", lib, 0);
}

/* Workers of the launcher write into pipes, where stdio would buffer whole blocks: a worker
 * that crashes would lose its last lines, and the lines of the ranks would reach the console
 * late. DDPLUA_UNBUFFERED (set by the launcher, as PYTHONUNBUFFERED) makes stdout line
 * buffered. */
static void line_buffer_if_asked(void) {
  const char *v = getenv("DDPLUA_UNBUFFERED");
  if (v && *v && strcmp(v, "0") != 0) setvbuf(stdout, NULL, _IOLBF, 0);
}

/* Run -e / -l, the script and the REPL as the options say. Returns the exit status. */
static int run_lua(const ddp_cli_options *opts, int argc, char **argv) {
  char root[PATH_BUF];
  ddp_cli_root(root, sizeof root);
  lua_State *L = ddp_host_new(root, argc, argv, opts->script);
  if (!L) return DDP_CLI_EXIT_ERROR;

  int status = 0;
  for (int i = 0; i < opts->n_actions && status == 0; i++) {
    const ddp_cli_action *a = &opts->actions[i];
    status = a->kind == DDP_CLI_EXEC ? ddp_host_dostring(L, a->text, "=(command line)")
                                     : ddp_host_require(L, a->text, a->text);
  }
  if (status == 0 && opts->script) status = ddp_host_run_script(L, argc, argv, opts->script);
  int repl = opts->interactive || (!opts->script && opts->n_actions == 0);
  if (status == 0 && repl) status = ddp_repl_run(L, isatty(STDIN_FILENO));

  fflush(stdout);
  lua_close(L);
  return status == 0 ? DDP_CLI_EXIT_OK : DDP_CLI_EXIT_ERROR;
}

int main(int argc, char **argv) {
  if (argc > 1) {
    const subcommand *sub = find_subcommand(argv[1]);
    if (sub) return sub->run(argc - 1, argv + 1);
  }

  ddp_cli_options opts;
  int status = ddp_cli_parse(&opts, argc, argv);
  if (status != DDP_CLI_EXIT_OK) {
    ddp_cli_options_free(&opts);
    return status;
  }
  if (opts.show_help) {
    ddp_cli_usage(stdout);
    if (subcommands[0].name) {
      printf("\nsubcommands:\n");
      for (const subcommand *s = subcommands; s->name; s++) printf("  %-12s %s\n", s->name, s->help);
    }
  } else if (opts.show_version) {
    print_version();
  } else if (opts.launch.requested && opts.interactive && !opts.script) {
    point_lua_at_own_runtime();
    status = ddp_dist_repl_run(&opts, argc, argv); /* the distributed REPL (dist_repl.c) */
  } else if (opts.launch.requested) {
    status = ddp_launcher_run(&opts, argc, argv);
  } else {
    /* A write to a socket whose peer died (Gloo's, when another rank or node is killed)
     * raises SIGPIPE, whose default ends the process without a word; ignored, the write
     * fails with EPIPE and the process group names the dead peer. The Python interpreter
     * that runs PyTorch ignores SIGPIPE the same way. */
    signal(SIGPIPE, SIG_IGN);
    ddp_process_adopt_report_channel(); /* a launcher's worker: how it reports a failure */
    ddp_status_adopt();                  /* and its status page (Note [rank status pages]) */
    line_buffer_if_asked();
    point_lua_at_own_runtime();
    status = run_lua(&opts, argc, argv);
  }
  ddp_cli_options_free(&opts);
  return status;
}
