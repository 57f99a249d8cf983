/* The command line of `meshpg sim`: its usage text, its flags parsed into
 * a sim_args, and the checks of the flags against each other. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

static const char sim_usage[] =
    "usage: meshpg sim [SPEC.toml] [--mesh dp=2,tp=2,cp=2] [--flatten NAME=d1,d2]...\n"
    "                  [--order tp-cp-dp] [--world N] [--steps K]\n"
    "                  [--shard | --hsdp R | --fsdp] [--optim adam|sgd]\n"
    "                  [--microbatches M] [--seed S] [--timeout SEC] [--quiet]\n"
    "                  [--batch B] [--seq T] [--hidden H] [--lr LR]\n"
    "                  [--bucket-mb MB] [--tol TOL] [--fail-rank R[:STEP]]\n"
    "\n"
    "Run one simulated rank per thread (thread backend): together they train\n"
    "a Megatron-style MLP (column-parallel W1, tanh, row-parallel W2 over tp;\n"
    "tokens split over cp; samples split over dp) with meshpg's gradient sync,\n"
    "then compare every rank's parameters with single-process training.\n"
    "\n"
    "  SPEC.toml          mesh and [sync] settings from a spec file\n"
    "  --mesh DIMS        the dims, outermost first; replaces the spec's dims\n"
    "                     (default without spec or --mesh: dp=2,tp=2,cp=2,\n"
    "                     or dp=auto,tp=2,cp=2 when --world is given); the\n"
    "                     data dims are dp, or dp_replicate and dp_shard\n"
    "  --flatten N=D,..   add a flattened dim set (repeatable)\n"
    "  --order ORDER      reorder the dims by a Megatron order string\n"
    "  --world N          number of ranks; resolves a -1 dim\n"
    "                     (default: the product of the sizes)\n"
    "  --steps K          optimizer steps (default 20)\n"
    "  --shard            sharded data parallel (distributed optimizer): the\n"
    "                     sync's shard mode reduce-scatters every bucket over\n"
    "                     dp_cp, each rank updates (and keeps Adam state for)\n"
    "                     only the elements it owns, and the params are\n"
    "                     all-gathered before their first use in forward\n"
    "                     (also set by [sync] mode = \"shard\" in the spec,\n"
    "                     with its shard_dims and replicate_dims)\n"
    "  --hsdp R           HSDP: dp is split into dp_replicate=R x dp_shard=dp/R;\n"
    "                     shard mode over dp_shard,cp, the owned shards\n"
    "                     all-reduced over dp_replicate\n"
    "  --fsdp             FSDP owns dp: one sync (fsdp_owns_dp) averages the\n"
    "                     gradients over cp only, a second one in shard mode\n"
    "                     reduce-scatters them over dp and gathers the params\n"
    "                     (also set by fsdp_owns_dp = true in the spec)\n"
    "  --optim OPT        adam (default) or sgd, the same in the reference\n"
    "  --microbatches M   gradient accumulation over M micro-batches (default 1)\n"
    "  --seed S           seed of the data and the initial weights (default 1)\n"
    "  --timeout SEC      collective timeout of every rank (default: the spec's\n"
    "                     [backend] timeout_s, 600)\n"
    "  --quiet            print only the verdict line (and errors)\n"
    "  --batch B          samples per step (default 2 * dp * M)\n"
    "  --seq T            tokens per sample (default 4 * cp)\n"
    "  --hidden H         hidden units, a multiple of tp (default: 32 rounded\n"
    "                     up to a multiple of tp)\n"
    "  --lr LR            learning rate (default 0.01 for adam, 0.5 for sgd)\n"
    "  --bucket-mb MB     gradient bucket size in MiB, also caps the first\n"
    "                     bucket (default: the spec's bucket_mb, 25)\n"
    "  --tol TOL          largest relative error that passes (default 1e-5)\n"
    "  --fail-rank R[:S]  testing: rank R stops at step S (default 0) without\n"
    "                     a word to its peers, like a crashed process; they\n"
    "                     must fail with a timeout (see --timeout), not hang\n"
    "\n"
    "Exit status: 0 every rank matches the reference; 1 a rank differs or\n"
    "failed, or the spec is invalid; 2 usage error.\n";

static int parse_double(const char *flag, const char *s, double lo,
                        int lo_inclusive, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || *end || !isfinite(v) || v < lo || (!lo_inclusive && v == lo)) {
    tool_error("%s: expected a number %s %g, found \"%s\"", flag,
               lo_inclusive ? ">=" : ">", lo, s);
    return 0;
  }
  *out = v;
  return 1;
}

static int parse_seed(const char *s, uint64_t *out) {
  char *end;
  if (!*s || *s == '-') goto bad;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end) goto bad;
  *out = (uint64_t)v;
  return 1;
bad:
  tool_error("--seed: expected a non-negative integer, found \"%s\"", s);
  return 0;
}


/* The value of the flag `a` (one that takes a value) into *args: returns 1,
 * or 0 after a usage error message. */
static int take_value(sim_args *args, const char *a, const char *v) {
  int ok = 1;
  if (strcmp(a, "--steps") == 0) {
    ok = tool_parse_int(a, v, 1, &args->steps);
  } else if (strcmp(a, "--microbatches") == 0) {
    ok = tool_parse_int(a, v, 1, &args->micro);
  } else if (strcmp(a, "--batch") == 0) {
    ok = tool_parse_int(a, v, 1, &args->batch);
  } else if (strcmp(a, "--seq") == 0) {
    ok = tool_parse_int(a, v, 1, &args->seq);
  } else if (strcmp(a, "--hidden") == 0) {
    ok = tool_parse_int(a, v, 1, &args->hidden);
  } else if (strcmp(a, "--hsdp") == 0) {
    ok = tool_parse_int(a, v, 1, &args->hsdp);
  } else if (strcmp(a, "--optim") == 0) {
    if (strcmp(v, "adam") == 0) {
      args->adam = 1;
    } else if (strcmp(v, "sgd") == 0) {
      args->adam = 0;
    } else {
      tool_error("--optim: expected adam or sgd, found \"%s\"", v);
      ok = 0;
    }
  } else if (strcmp(a, "--seed") == 0) {
    ok = parse_seed(v, &args->seed);
  } else if (strcmp(a, "--timeout") == 0) {
    ok = parse_double(a, v, 0.0, 0, &args->timeout);
  } else if (strcmp(a, "--lr") == 0) {
    ok = parse_double(a, v, 0.0, 0, &args->lr);
  } else if (strcmp(a, "--fail-rank") == 0) {
    char rbuf[32];
    const char *colon = strchr(v, ':');
    size_t n = colon ? (size_t)(colon - v) : strlen(v);
    if (n >= sizeof rbuf) n = sizeof rbuf - 1;
    memcpy(rbuf, v, n);
    rbuf[n] = '\0';
    ok = tool_parse_int("--fail-rank", rbuf, 0, &args->fail_rank) &&
         (!colon || tool_parse_int("--fail-rank step", colon + 1, 0,
                                   &args->fail_step));
  } else if (strcmp(a, "--bucket-mb") == 0) {
    ok = parse_double(a, v, 0.0, 0, &args->bucket_mb);
  } else {
    ok = parse_double(a, v, 0.0, 1, &args->tol);
  }
  return ok;
}

int sim_args_parse(int argc, char **argv, sim_args *args) {
  memset(args, 0, sizeof *args);
  args->steps = 20;
  args->micro = 1;
  args->adam = 1;
  args->tol = 1e-5;
  args->seed = 1;
  args->fail_rank = -1;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(sim_usage, stdout);
      return TOOL_EXIT_OK;
    } else if (strcmp(a, "--fsdp") == 0) {
      args->fsdp = 1;
    } else if (strcmp(a, "--shard") == 0) {
      args->shard = 1;
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      args->quiet = 1;
    } else if (strcmp(a, "--steps") == 0 || strcmp(a, "--microbatches") == 0 ||
               strcmp(a, "--seed") == 0 || strcmp(a, "--timeout") == 0 ||
               strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 ||
               strcmp(a, "--hidden") == 0 || strcmp(a, "--lr") == 0 ||
               strcmp(a, "--bucket-mb") == 0 || strcmp(a, "--tol") == 0 ||
               strcmp(a, "--fail-rank") == 0 || strcmp(a, "--hsdp") == 0 ||
               strcmp(a, "--optim") == 0) {
      if (i + 1 >= argc) {
        tool_error("%s needs a value", a);
        tool_usage_hint(sim_usage);
        return TOOL_EXIT_USAGE;
      }
      if (!take_value(args, a, argv[++i])) return TOOL_EXIT_USAGE;
    } else {
      int took = tool_spec_arg(&args->spec, argc, argv, &i, sim_usage);
      if (took < 0) return TOOL_EXIT_USAGE;
      if (!took) {
        tool_error("unknown option \"%s\"", a);
        tool_usage_hint(sim_usage);
        return TOOL_EXIT_USAGE;
      }
    }
  }
  if (args->fsdp + args->shard + (args->hsdp > 0) > 1) {
    tool_error("--shard, --hsdp and --fsdp exclude each other");
    tool_usage_hint(sim_usage);
    return TOOL_EXIT_USAGE;
  }
  return -1;
}
