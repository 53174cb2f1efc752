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
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* A long option: `--name` or, when takes_value, `--name=value` / `--name value`. The handler
 * returns 0, or -1 after printing what was wrong. Launcher options mark their arguments in
 * opts->launcher_arg so that workers get the command line without them. In names, '-' and
 * '_' are the same (torchrun takes --nproc-per-node and --nproc_per_node). */
typedef struct long_option {
  const char *name;
  const char *metavar; /* the value's name in --help, NULL when the option takes none */
  int launcher;
  int (*handle)(ddp_cli_options *opts, const char *value);
  const char *help; /* one line for --help */
} long_option;

static int bad_value(const char *option, const char *what, const char *value) {
  fprintf(stderr, DDP_CLI_NAME ": option '--%s' needs %s, got '%s'\n", option, what, value);
  return -1;
}

/* A whole decimal integer in [lo, hi] into *out, or -1 after a message. */
static int parse_int(const char *option, const char *value, int lo, int hi, const char *what,
                     int *out) {
  char *end;
  errno = 0;
  long v = strtol(value, &end, 10);
  if (errno || end == value || *end != '\0' || v < lo || v > hi)
    return bad_value(option, what, value);
  *out = (int)v;
  return 0;
}

/* GPUs the NVIDIA driver knows (entries of /proc/driver/nvidia/gpus), without loading CUDA. */
static int count_gpus(void) {
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* --nproc_per_node: a count, or as torchrun: "cpu" the online cores, "gpu" the GPUs,
 * "auto" the GPUs when there are some and the cores otherwise. */
static int set_nproc(ddp_cli_options *opts, const char *value) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int gpus = strcmp(value, "gpu") == 0 || strcmp(value, "auto") == 0 ? count_gpus() : 0;
  if (strcmp(value, "cpu") == 0 || (strcmp(value, "auto") == 0 && gpus == 0)) {
    opts->launch.nproc_per_node = cores > 0 ? (int)cores : 1;
    return 0;
  }
  if (strcmp(value, "gpu") == 0 || strcmp(value, "auto") == 0) {
    if (gpus == 0) return bad_value("nproc_per_node", "GPUs for \"gpu\" (none found)", value);
    opts->launch.nproc_per_node = gpus;
    return 0;
  }
  return parse_int("nproc_per_node", value, 1, 4096,
                   "a count of workers >= 1 (or auto, cpu, gpu)", &opts->launch.nproc_per_node);
}

/* --nnodes: a count M, or torchrun's elastic range MIN:MAX (1 <= MIN <= MAX), which makes
 * the job elastic (Note [elastic rendezvous] in elastic.c). */
static int set_nnodes(ddp_cli_options *opts, const char *value) {
  const char *colon = strchr(value, ':');
  if (!colon) {
    if (parse_int("nnodes", value, 1, 1 << 20, "a count of nodes >= 1 or a range MIN:MAX",
                  &opts->launch.nnodes) != 0)
      return -1;
    opts->launch.nnodes_max = opts->launch.nnodes;
    return 0;
  }
  char lo[32];
  size_t n = (size_t)(colon - value);
  if (n == 0 || n >= sizeof lo) return bad_value("nnodes", "a range MIN:MAX of node counts", value);
  memcpy(lo, value, n);
  lo[n] = '\0';
  int min, max;
  if (parse_int("nnodes", lo, 1, 1 << 20, "a range MIN:MAX with MIN >= 1", &min) != 0 ||
      parse_int("nnodes", colon + 1, 1, 1 << 20, "a range MIN:MAX with MAX >= 1", &max) != 0)
    return -1;
  if (min > max) return bad_value("nnodes", "a range MIN:MAX with MIN <= MAX", value);
  opts->launch.nnodes = min;
  opts->launch.nnodes_max = max;
  opts->launch.elastic = 1;
  return 0;
}

static int set_node_rank(ddp_cli_options *opts, const char *value) {
  opts->launch.node_rank_set = 1;
  return parse_int("node_rank", value, 0, 1 << 20, "a node rank >= 0", &opts->launch.node_rank);
}

/* --rdzv_endpoint=HOST[:PORT]: where the rendezvous store is (hosted by the agent on HOST). */
static int set_rdzv_endpoint(ddp_cli_options *opts, const char *value) {
  if (!*value || *value == ':') return bad_value("rdzv_endpoint", "HOST[:PORT]", value);
  const char *colon = strrchr(value, ':');
  int port;
  if (colon && parse_int("rdzv_endpoint", colon + 1, 1, 65535, "HOST:PORT with a port in 1..65535",
                         &port) != 0)
    return -1;
  opts->launch.rdzv_endpoint = value;
  opts->launch.elastic = 1;
  return 0;
}

static int set_rdzv_id(ddp_cli_options *opts, const char *value) {
  for (const char *c = value; *c; c++)
    if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_' || *c == '.'))
      return bad_value("rdzv_id", "a job id of letters, digits, '-', '_' and '.'", value);
  if (!*value || strlen(value) > 128) return bad_value("rdzv_id", "a job id of 1..128 characters", value);
  opts->launch.rdzv_id = value;
  return 0;
}

/* --rdzv_backend: c10d (the store-based rendezvous, torchrun's recommended one) or static
 * (the fixed --nnodes / --node_rank job); others (etcd) are not built in. */
static int set_rdzv_backend(ddp_cli_options *opts, const char *value) {
  opts->launch.rdzv_static = strcmp(value, "static") == 0;
  if (strcmp(value, "c10d") == 0 || opts->launch.rdzv_static) return 0;
  return bad_value("rdzv_backend", "c10d or static (the only backends built in)", value);
}

/* --rdzv_conf=key=value,...: last_call_timeout and join_timeout (seconds), as torchrun. */
static int set_rdzv_conf(ddp_cli_options *opts, const char *value) {
  char buf[256];
  if (strlen(value) >= sizeof buf) return bad_value("rdzv_conf", "at most 255 characters", value);
  snprintf(buf, sizeof buf, "%s", value);
  for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq) return bad_value("rdzv_conf", "key=value pairs separated by ','", value);
    *eq = '\0';
    char *end;
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (errno || end == eq + 1 || *end || !(v > 0) || v > 1e6)
      return bad_value("rdzv_conf", "a number of seconds > 0 for each timeout", value);
    if (strcmp(kv, "last_call_timeout") == 0) opts->launch.last_call_s = v;
    else if (strcmp(kv, "join_timeout") == 0) opts->launch.join_timeout_s = v;
    else return bad_value("rdzv_conf", "the keys last_call_timeout and join_timeout", value);
  }
  return 0;
}

static int set_master_addr(ddp_cli_options *opts, const char *value) {
  if (!*value) return bad_value("master_addr", "a host name or address", value);
  opts->launch.master_addr = value;
  return 0;
}

static int set_master_port(ddp_cli_options *opts, const char *value) {
  return parse_int("master_port", value, 1, 65535, "a port in 1..65535", &opts->launch.master_port);
}

static int set_standalone(ddp_cli_options *opts, const char *value) {
  opts->launch.standalone = 1;
  return 0;
}

static int set_max_restarts(ddp_cli_options *opts, const char *value) {
  return parse_int("max_restarts", value, 0, 1000000, "a count >= 0", &opts->launch.max_restarts);
}

static int set_log_dir(ddp_cli_options *opts, const char *value) {
  if (!*value) return bad_value("log_dir", "a directory", value);
  opts->launch.log_dir = value;
  return 0;
}

static int set_redirects(ddp_cli_options *opts, const char *value) {
  opts->launch.redirects_set = 1;
  return parse_int("redirects", value, 0, 3, "0 (none), 1 (stdout), 2 (stderr) or 3 (both)",
                   &opts->launch.redirects);
}

static int set_tee(ddp_cli_options *opts, const char *value) {
  opts->launch.redirects_set = 1;
  return parse_int("tee", value, 0, 3, "0 (none), 1 (stdout), 2 (stderr) or 3 (both)",
                   &opts->launch.tee);
}

static int set_status_interval(ddp_cli_options *opts, const char *value) {
  return parse_int("status_interval", value, 0, 86400, "seconds >= 0 (0: no live view)",
                   &opts->launch.status_interval);
}

static int set_version(ddp_cli_options *opts, const char *value) {
  opts->show_version = 1;
  return 0;
}

static int set_help(ddp_cli_options *opts, const char *value) {
  opts->show_help = 1;
  return 0;
}

static const long_option long_options[] = {
  {"version", NULL, 0, set_version, "print the version of ddplua and LuaJIT, then exit"},
  {"help", NULL, 0, set_help, "print this help, then exit"},
  /* The launcher (torchrun's flags): any of them runs the script as a group of workers. */
  {"nproc_per_node", "N", 1, set_nproc,
   "start N workers on this node (auto: one per GPU, else per core; cpu; gpu)"},
  {"nnodes", "M|MIN:MAX", 1, set_nnodes,
   "nodes in the job (default 1): WORLD_SIZE = M * N; MIN:MAX an elastic job"},
  {"node_rank", "K", 1, set_node_rank, "this node's rank, 0..M-1 (default 0): RANK = K * N + local rank"},
  {"master_addr", "A", 1, set_master_addr, "host of rank 0, which hosts the store (default 127.0.0.1)"},
  {"master_port", "P", 1, set_master_port, "port of rank 0's store (default 29500)"},
  {"standalone", NULL, 1, set_standalone, "one node, MASTER_ADDR 127.0.0.1 and a free MASTER_PORT"},
  {"max_restarts", "R", 1, set_max_restarts,
   "restart the whole group up to R times (failures; elastic: also membership changes)"},
  {"rdzv_endpoint", "H:P", 1, set_rdzv_endpoint,
   "elastic rendezvous store, hosted by the agent on HOST (default master_addr:master_port)"},
  {"rdzv_id", "JOB", 1, set_rdzv_id, "the job's id (TORCHELASTIC_RUN_ID), the same on every node"},
  {"rdzv_backend", "c10d", 1, set_rdzv_backend, "c10d (store rendezvous) or static"},
  {"rdzv_conf", "K=V,...", 1, set_rdzv_conf,
   "last_call_timeout=S (default 30), join_timeout=S (default 600)"},
  {"log_dir", "DIR", 1, set_log_dir, "write DIR/rank_N/{stdout,stderr}.log (attempt_K/ with restarts)"},
  {"redirects", "0-3", 1, set_redirects, "send worker stdout (1), stderr (2), both (3) to log files only"},
  {"tee", "0-3", 1, set_tee, "send worker stdout (1), stderr (2), both (3) to log files and console"},
  {"status_interval", "S", 1, set_status_interval,
   "live view: one line per rank, in place on a terminal, else every S s (default 60; 0: off; "
   "never in the distributed REPL, whose prompt owns the terminal)"},
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
  for (int i = 0; i < N_LONG_OPTIONS; i++) {
    const long_option *o = &long_options[i];
    char flag[64];
    snprintf(flag, sizeof flag, "--%s%s%s", o->name, o->metavar ? "=" : "",
             o->metavar ? o->metavar : "");
    if (i == 2) fprintf(out, "\nlauncher (as torchrun; values as --flag=v or --flag v):\n");
    fprintf(out, "  %-22s %s\n", flag, o->help);
  }
  fprintf(out,
          "\n"
          "The script sees its arguments as `...` and in the global `arg` (arg[0] is the script).\n"
          "Exit status: 0 on success, 1 on a Lua error (or a failed worker), 2 on a bad command\n"
          "line.\n");
}

static int usage_error(const char *fmt, const char *what) {
  fprintf(stderr, DDP_CLI_NAME ": ");
  fprintf(stderr, fmt, what);
  fprintf(stderr, "\nTry '" DDP_CLI_NAME " --help' for more information.\n");
  return DDP_CLI_EXIT_USAGE;
}

/* Handle argv[*i], a "--name[=value]" argument; may consume argv[*i + 1] as the value. */
/* Whether the first `len` characters of `arg` spell `name`, '-' matching '_'. */
static int same_name(const char *name, const char *arg, size_t len) {
  if (strlen(name) != len) return 0;
  for (size_t k = 0; k < len; k++) {
    char a = arg[k] == '-' ? '_' : arg[k];
    if (a != name[k]) return 0;
  }
  return 1;
}

static int parse_long(ddp_cli_options *opts, int argc, char **argv, int *i) {
  const char *arg = argv[*i] + 2;
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  for (int k = 0; k < N_LONG_OPTIONS; k++) {
    const long_option *o = &long_options[k];
    if (!same_name(o->name, arg, len)) continue;
    int first = *i;
    const char *value = NULL;
    if (o->metavar) {
      if (eq) value = eq + 1;
      else if (*i + 1 < argc) value = argv[++*i];
      else return usage_error("option '--%s' needs a value", o->name);
    } else if (eq) {
      return usage_error("option '--%s' takes no value", o->name);
    }
    if (o->launcher) {
      opts->launch.requested = 1;
      for (int j = first; j <= *i; j++) opts->launcher_arg[j] = 1;
    }
    if (o->handle(opts, value) != 0) {
      fprintf(stderr, "Try '" DDP_CLI_NAME " --help' for more information.\n");
      return DDP_CLI_EXIT_USAGE;
    }
    return DDP_CLI_EXIT_OK;
  }
  return usage_error("unknown option '%s'", argv[*i]);
}

/* Launcher flags that contradict each other or what the workers would run. */
static int check_launch(const ddp_cli_options *opts, char **argv) {
  const ddp_cli_launch *l = &opts->launch;
  if (!l->requested) return DDP_CLI_EXIT_OK;
  if (l->standalone && l->nnodes != 1)
    return usage_error("option '--standalone' runs one node, not --nnodes=%s", "M > 1");
  if (l->elastic && l->standalone)
    return usage_error("option '--standalone' runs one node, not an elastic job (%s)",
                       "--nnodes=MIN:MAX or --rdzv_endpoint");
  if (l->elastic && l->rdzv_static)
    return usage_error("option '--rdzv_backend=static' runs a fixed job: give %s",
                       "--nnodes=M and --node_rank=K, not --nnodes=MIN:MAX or --rdzv_endpoint");
  if (l->elastic && l->node_rank_set)
    return usage_error("option '--node_rank' cannot be given to an elastic job: %s",
                       "the rendezvous ranks the nodes in the order they join");
  if (l->elastic && opts->interactive)
    return usage_error("option '%s' cannot be used with an elastic job", "-i");
  if (!l->elastic && l->node_rank >= l->nnodes)
    return usage_error("option '--node_rank' must be below --nnodes (%s)", "0 <= K < M");
  /* -i alone is the distributed REPL (dist_repl.c); after a script it has no meaning */
  if (opts->interactive && (opts->script || opts->n_actions > 0))
    return usage_error("option '%s' cannot be used with the launcher", "-i");
  if (opts->interactive) return DDP_CLI_EXIT_OK;
  if (opts->script && strcmp(argv[opts->script], "-") == 0)
    return usage_error("the launcher cannot read the script from stdin ('%s')", "-");
  if (!opts->script && opts->n_actions == 0)
    return usage_error("the launcher needs a script to run (or -e code), as in '%s'",
                       DDP_CLI_NAME " --nproc_per_node=2 train.lua");
  return DDP_CLI_EXIT_OK;
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
  opts->launch.nproc_per_node = 1;
  opts->launch.nnodes = 1;
  opts->launch.nnodes_max = 1;
  opts->launch.last_call_s = 30;
  opts->launch.join_timeout_s = 600;
  opts->launch.master_addr = "127.0.0.1";
  opts->launch.master_port = 29500;
  opts->launch.status_interval = 60;
  opts->launcher_arg = calloc((size_t)argc + 1, 1);
  if (!opts->launcher_arg) {
    fprintf(stderr, DDP_CLI_NAME ": out of memory\n");
    return DDP_CLI_EXIT_ERROR;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int status = DDP_CLI_EXIT_OK;
    if (a[0] != '-' || strcmp(a, "-") == 0) { /* the script (or stdin) */
      opts->script = i;
      break;
    }
    if (strcmp(a, "--") == 0) {
      if (i + 1 < argc) opts->script = i + 1;
      break;
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
  return check_launch(opts, argv);
}

void ddp_cli_options_free(ddp_cli_options *opts) {
  free(opts->actions);
  opts->actions = NULL;
  opts->n_actions = 0;
  free(opts->launcher_arg);
  opts->launcher_arg = NULL;
}
