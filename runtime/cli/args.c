/* args.c: the command line of the ddplua executable.
 *
 *   ddplua [options] [script [args...]]
 *
 * Options stop at the first argument that is not one (the script), at "--" (the next
 * argument is the script) or at "-" (the script is stdin); the rest goes to the script, as
 * with the stock luajit. Long options live in one table (long_options below) so launcher
 * flags such as --nproc_per_node=N can be added as rows; subcommands (`ddplua verify ...`)
 * are dispatched before this parser runs (main.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* A long option: `--name` or, when takes_value, `--name=value` / `--name value`. The handler
 * returns 0, or -1 after printing what was wrong. */
typedef struct long_option {
  const char *name;
  int takes_value;
  int (*handle)(ddp_cli_options *opts, const char *value);
  const char *help; /* one line for --help */
} long_option;

static int set_version(ddp_cli_options *opts, const char *value) {
  opts->show_version = 1;
  return 0;
}

static int set_help(ddp_cli_options *opts, const char *value) {
  opts->show_help = 1;
  return 0;
}

static const long_option long_options[] = {
  {"version", 0, set_version, "print the version of ddplua and LuaJIT, then exit"},
  {"help", 0, set_help, "print this help, then exit"},
  /* Launcher flags go here (--nproc_per_node=N, --nnodes=N, --node_rank=R, ...). */
};

#define N_LONG_OPTIONS ((int)(sizeof long_options / sizeof long_options[0]))

void ddp_cli_usage(void *out_) {
  FILE *out = out_;
  fprintf(out,
          "usage: " DDP_CLI_NAME " [options] [script [args...]]\n"
          "Runs a Lua script under LuaJIT with the ddplua runtime (`local dl = require \"ddplua\"`).\n"
          "With no script and no -e, starts the REPL (where `dl` is already loaded).\n"
          "\n"
          "options:\n"
          "  -e code      run `code` (several -e run in order, before the script)\n"
          "  -l name      require library `name` into the global `name`\n"
          "  -i           enter the REPL after running the script and the -e code\n"
          "  -v           same as --version\n"
          "  -h           same as --help\n"
          "  --           stop handling options; the next argument is the script\n"
          "  -            read the script from stdin\n");
  for (int i = 0; i < N_LONG_OPTIONS; i++)
    fprintf(out, "  --%-10s %s\n", long_options[i].name, long_options[i].help);
  fprintf(out,
          "\n"
          "The script sees its arguments as `...` and in the global `arg` (arg[0] is the script).\n"
          "Exit status: 0 on success, 1 on a Lua error, 2 on a bad command line.\n");
}

static int usage_error(const char *fmt, const char *what) {
  fprintf(stderr, DDP_CLI_NAME ": ");
  fprintf(stderr, fmt, what);
  fprintf(stderr, "\nTry '" DDP_CLI_NAME " --help' for more information.\n");
  return DDP_CLI_EXIT_USAGE;
}

/* Handle argv[*i], a "--name[=value]" argument; may consume argv[*i + 1] as the value. */
static int parse_long(ddp_cli_options *opts, int argc, char **argv, int *i) {
  const char *arg = argv[*i] + 2;
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  for (int k = 0; k < N_LONG_OPTIONS; k++) {
    const long_option *o = &long_options[k];
    if (strlen(o->name) != len || strncmp(o->name, arg, len) != 0) continue;
    const char *value = NULL;
    if (o->takes_value) {
      if (eq) value = eq + 1;
      else if (*i + 1 < argc) value = argv[++*i];
      else return usage_error("option '--%s' needs a value", o->name);
    } else if (eq) {
      return usage_error("option '--%s' takes no value", o->name);
    }
    return o->handle(opts, value) == 0 ? DDP_CLI_EXIT_OK : DDP_CLI_EXIT_USAGE;
  }
  return usage_error("unknown option '%s'", argv[*i]);
}

/* Append a -e / -l action; the text is either attached ("-eCODE") or the next argument. */
static int parse_action(ddp_cli_options *opts, enum ddp_cli_action_kind kind, int argc,
                        char **argv, int *i) {
  const char *text = argv[*i] + 2;
  if (*text == '\0') {
    if (*i + 1 >= argc) return usage_error("option '%s' needs an argument", argv[*i]);
    text = argv[++*i];
  }
  ddp_cli_action *grown = realloc(opts->actions, (size_t)(opts->n_actions + 1) * sizeof *grown);
  if (!grown) {
    fprintf(stderr, DDP_CLI_NAME ": out of memory\n");
    return DDP_CLI_EXIT_ERROR;
  }
  opts->actions = grown;
  opts->actions[opts->n_actions++] = (ddp_cli_action){kind, text};
  return DDP_CLI_EXIT_OK;
}

int ddp_cli_parse(ddp_cli_options *opts, int argc, char **argv) {
  memset(opts, 0, sizeof *opts);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int status = DDP_CLI_EXIT_OK;
    if (a[0] != '-' || strcmp(a, "-") == 0) { /* the script (or stdin) */
      opts->script = i;
      return DDP_CLI_EXIT_OK;
    }
    if (strcmp(a, "--") == 0) {
      if (i + 1 < argc) opts->script = i + 1;
      return DDP_CLI_EXIT_OK;
    }
    if (a[1] == '-') status = parse_long(opts, argc, argv, &i);
    else if (a[1] == 'e') status = parse_action(opts, DDP_CLI_EXEC, argc, argv, &i);
    else if (a[1] == 'l') status = parse_action(opts, DDP_CLI_REQUIRE, argc, argv, &i);
    else if (strcmp(a, "-i") == 0) opts->interactive = 1;
    else if (strcmp(a, "-v") == 0) opts->show_version = 1;
    else if (strcmp(a, "-h") == 0) opts->show_help = 1;
    else status = usage_error("unknown option '%s'", a);
    if (status != DDP_CLI_EXIT_OK) return status;
  }
  return DDP_CLI_EXIT_OK;
}

void ddp_cli_options_free(ddp_cli_options *opts) {
  free(opts->actions);
  opts->actions = NULL;
  opts->n_actions = 0;
}
