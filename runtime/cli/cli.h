/* cli.h: internal declarations of the ddplua executable (runtime/cli/), the LuaJIT host.
 *
 * The executable is the only part of ddplua that includes Lua headers (DESIGN.md, Layers).
 * It is split in these files:
 *   main.c        dispatch: subcommands, options, then the Lua host
 *   args.c        command-line parsing into a ddp_cli_options
 *   host.c        the Lua state: libraries, package.path, the `arg` table, protected calls
 *                 with a traceback, Ctrl-C, error reports
 *   repl.c        the read-eval-print loop (libedit on a terminal, plain fgets on a pipe)
 *   dist_repl.c   `ddplua --nproc_per_node=N -i`: one prompt driving a REPL on every rank
 *                 (both ends: the prompt, and the ranks' side of the connection)
 *   repl_wire.c   the distributed REPL's frames and handshake payloads as pure functions
 *                 of bytes (shared by both ends and the fuzz target; no Lua, no sockets)
 *   launcher.c    the launcher (torchrun's job)
 *   rendezvous.c  the elastic rendezvous of --nnodes=MIN:MAX on a TCP store (rendezvous.h)
 */
#ifndef DDPLUA_CLI_H
#define DDPLUA_CLI_H

#include <lua.h>

/* Name used in messages ("ddplua: cannot open foo.lua: ...") and in --help. */
#define DDP_CLI_NAME "ddplua"

/* Exit statuses of the executable: 0 success, 1 a Lua error (script, -e, load), 2 a bad
 * command line (unknown option, missing option argument), as most Unix tools do. */
enum ddp_cli_exit { DDP_CLI_EXIT_OK = 0, DDP_CLI_EXIT_ERROR = 1, DDP_CLI_EXIT_USAGE = 2 };

/* One -e or -l option, kept in command-line order because they run in that order. */
enum ddp_cli_action_kind { DDP_CLI_EXEC, DDP_CLI_REQUIRE };
typedef struct ddp_cli_action {
  enum ddp_cli_action_kind kind;
  const char *text; /* the code of -e, or the module name of -l */
} ddp_cli_action;

/* Launcher flags (torchrun's): set through the long-option table of args.c, used by
 * launcher.c. `requested` is set by any of them; the others hold the defaults below until a
 * flag changes them. */
typedef struct ddp_cli_launch {
  int requested;      /* a launcher flag was given: run the launcher, not the script */
  int nproc_per_node; /* --nproc_per_node=N (default 1; "auto"/"cpu"/"gpu" resolved here) */
  int nnodes;         /* --nnodes=M (default 1); with --nnodes=MIN:MAX, MIN */
  int nnodes_max;     /* --nnodes=MIN:MAX: MAX (else equal to nnodes) */
  int node_rank;      /* --node_rank=K, 0 <= K < nnodes (default 0) */
  int node_rank_set;  /* --node_rank appeared (refused with an elastic rendezvous) */
  int elastic;        /* --nnodes=MIN:MAX or --rdzv_endpoint: an elastic job (elastic.c) */
  const char *rdzv_endpoint; /* --rdzv_endpoint=HOST[:PORT], or NULL (master_addr:master_port) */
  const char *rdzv_id;       /* --rdzv_id=JOB (TORCHELASTIC_RUN_ID; default "none") */
  int rdzv_static;           /* --rdzv_backend=static: the fixed job (refused with elastic) */
  double last_call_s; /* --rdzv_conf last_call_timeout=S: once MIN nodes joined a round, wait
                         this long for more (default 30, torchrun's) */
  double join_timeout_s; /* --rdzv_conf join_timeout=S: a round that has not MIN nodes after
                            this long ends the job (default 600, torchrun's) */
  const char *master_addr; /* --master_addr=A (default "127.0.0.1") */
  int master_port;    /* --master_port=P (default 29500) */
  int standalone;     /* --standalone: one node, a free port on 127.0.0.1 */
  int max_restarts;   /* --max_restarts=R (default 0) */
  const char *log_dir; /* --log_dir=DIR, or NULL */
  int redirects;      /* --redirects=0..3: bit 1 stdout, bit 2 stderr go to log files only */
  int tee;            /* --tee=0..3: those streams go to log files and the console */
  int redirects_set;  /* --redirects or --tee appeared (otherwise --log_dir means tee=3) */
  int status_interval; /* --status_interval=S: the live view (live_view.c): on a terminal the
                          lines update in place; otherwise a status line per rank every S
                          seconds (default 60); 0 turns both off */
} ddp_cli_launch;

/* What the command line asked for. */
typedef struct ddp_cli_options {
  ddp_cli_action *actions; /* -e / -l in order (malloc'd, n_actions entries) */
  int n_actions;
  int interactive;  /* -i: REPL after the script and the -e code */
  int show_version; /* -v / --version */
  int show_help;    /* -h / --help */
  int script;       /* argv index of the script ("-" is stdin), or 0 when there is none */
  ddp_cli_launch launch;
  unsigned char *launcher_arg; /* argc entries (malloc'd): 1 where argv[i] belongs to a
                                  launcher flag, so workers get the command line without it */
} ddp_cli_options;

/* Parse argv into *opts. Options come before the script; everything after the script (or
 * after "--") belongs to the script. Returns DDP_CLI_EXIT_OK, or DDP_CLI_EXIT_USAGE after
 * printing "ddplua: <what was wrong>" and a hint to stderr. */
int ddp_cli_parse(ddp_cli_options *opts, int argc, char **argv);

/* Free what ddp_cli_parse allocated. */
void ddp_cli_options_free(ddp_cli_options *opts);

/* Print the usage text to `out`. */
void ddp_cli_usage(void *out);

/* The project root: the parent of the directory that holds the executable (resolved through
 * /proc/self/exe, so it works from any directory and through symlinks), written into `buf`.
 * Returns 0, or -1 when it cannot be found (then buf is "."). */
int ddp_cli_root(char *buf, size_t size);

/* The directory that holds the executable (e.g. <root>/build), or -1 as ddp_cli_root. */
int ddp_cli_exe_dir(char *buf, size_t size);

/* Create the Lua state: standard libraries, package.path with <root>/lua and ./ first, and
 * the global `arg` (laid out as the stock luajit does: arg[0] the script, arg[1..] its
 * arguments, negative indices the executable and the options before the script; with no
 * script, arg[0] is the executable). Returns NULL (after a message) when out of memory. */
lua_State *ddp_host_new(const char *root, int argc, char **argv, int script);

/* Call the function under `nargs` arguments on top of the stack in protected mode, with a
 * traceback added to the error message and Ctrl-C turned into a Lua error ("interrupted!")
 * for the duration of the call. Returns the lua_pcall status; on failure the message (with
 * the traceback) is on top of the stack. */
int ddp_host_call(lua_State *L, int nargs, int nresults);

/* on != 0: while ddp_host_call runs, every Ctrl-C interrupts the code (the REPL: it ends
 * only on Ctrl-D); 0 (the default, scripts): a second Ctrl-C ends the process. */
void ddp_host_keep_running_on_sigint(int on);

/* When status != 0, print the message on top of the stack as "ddplua: <message>" to stderr
 * and pop it. Returns status. */
int ddp_host_report(lua_State *L, int status);

/* Run `code` (chunk name `name`, e.g. "=(command line)"). Returns the status; reports. */
int ddp_host_dostring(lua_State *L, const char *code, const char *name);

/* `name = require(name)` as a global (the -l option and the REPL's `dl`). */
int ddp_host_require(lua_State *L, const char *global, const char *module);

/* Load and run the script at argv[script] ("-" reads stdin) with argv[script+1..] as `...`.
 * Returns the status; reports. */
int ddp_host_run_script(lua_State *L, int argc, char **argv, int script);

/* The read-eval-print loop on stdin: "> " and ">> " prompts, expressions printed, errors
 * reported with a traceback without leaving the loop, ends on end of input. `tty` selects
 * libedit (line editing, history in ~/.ddplua_history, a banner) over plain line reads.
 * Returns DDP_CLI_EXIT_OK. */
int ddp_repl_run(lua_State *L, int tty);

/* The distributed REPL (dist_repl.c): `ddplua --nproc_per_node=N -i` with no script. Starts
 * the launcher (in a child, its own process group) with DDPLUA_REPL_CONNECT telling every
 * worker's REPL to take its input from this process instead of stdin, then reads lines here
 * (libedit on a terminal) and runs each on every rank in lockstep (or on one with
 * `%rank K code`), printing what each rank printed with its rank, identical outputs once as
 * "[all ranks]". Ctrl-C interrupts the code on every rank; Ctrl-D ends the session. Returns
 * the exit status. */
int ddp_dist_repl_run(const ddp_cli_options *opts, int argc, char **argv);

/* Make ddp_repl_run send each complete input to `run` instead of running it (the prompt of
 * the distributed REPL): the text as typed, "%rank K " prefix included (the prefix is left
 * out when checking the input is complete). `run` prints what came back and returns 0.
 * NULL restores local running. */
typedef int (*ddp_repl_remote)(void *ctx, const char *code, size_t len);
void ddp_repl_set_remote(ddp_repl_remote run, void *ctx);

/* Run one complete input as the prompt does (compiled by the ddplua.repl session that
 * ddp_repl_run opened: locals kept, `?name`, `:time`), print its values, report its error.
 * Returns the status (0 when it ran without error). */
int ddp_repl_eval(lua_State *L, const char *code, size_t len);

/* A worker of the distributed REPL (dist_repl.c): when DDPLUA_REPL_CONNECT ("host:port") is
 * set, ddp_repl_run serves that connection instead of reading stdin: each input received is
 * compiled and run as at the prompt, with its stdout and stderr sent back. Returns
 * DDP_CLI_EXIT_OK when the prompt closes the connection. */
int ddp_repl_serve(lua_State *L, const char *address);

/* The launcher (launcher.c), torchrun's job: start opts->launch.nproc_per_node workers,
 * each this same executable run on argv without the launcher flags and with the torchrun
 * environment (RANK, LOCAL_RANK, WORLD_SIZE, ...); prefix or log their output; stop them all
 * when one fails (restarting the group up to max_restarts times); forward SIGINT/SIGTERM/
 * SIGHUP. Returns 0 when every worker exited 0, 1 after a failure (with a summary naming the
 * rank on stderr); on a forwarded signal the launcher ends by that signal. */
int ddp_launcher_run(const ddp_cli_options *opts, int argc, char **argv);

/* `ddplua <tool> args...` for tools written in Lua: runs ddplua.tools.<argv[0]>.main with
 * argv[1..] as a list; returns its exit status (runtime/cli/tools.c). */
int ddp_cli_run_lua_tool(int argc, char **argv);

#endif /* DDPLUA_CLI_H */
