#!/usr/bin/env python3
"""Compare meshpg's dense and expert (MoE) groups with Megatron-LM's.

usage: megatron_oracle.py [--meshpg PATH] [--count N] [--seed S]
                          [--max-world W] [--parallel-state FILE]

Megatron's parallel_state.py is not part of meshpg.  Its path comes from
--parallel-state or the environment variable MESHPG_MEGATRON_PARALLEL_STATE;
without a readable file the test is skipped (exit 77).  From that file only
the function generate_masked_orthogonal_rank_groups and the class
RankGenerator are taken (with the ast module) and run; the module's imports
(torch, ...) are never executed.

For N random layouts (tp, cp, dp, pp, expert tp, ep and a Megatron order
string) it follows the checks of Megatron's initialize_model_parallel to
decide whether Megatron accepts the layout, runs `meshpg plan --json` on the
same layout (--mesh, --order, --flatten, --experts), and requires that
  - meshpg accepts exactly the layouts Megatron accepts, and
  - every group compared below has the same members in the same order, and
    the groups come in the same order:
      dense:  tp, cp, dp, pp, dp-cp, tp-cp, tp-pp, tp-dp-cp
      expert: tp (etp), ep, dp (edp), tp-ep (etp_ep), tp-ep-pp (etp_ep_pp),
              and the expert generator's pp equals meshpg's pp.
Exit 0 when every layout agrees, 1 otherwise (the first differences are
printed), 77 when skipped.
"""
import argparse
import ast
import itertools
import json
import os
import random
import subprocess
import sys
import typing

SKIP = 77
ENV = "MESHPG_MEGATRON_PARALLEL_STATE"
TOKENS = ["tp", "cp", "ep", "dp", "pp"]


def load_megatron(path):
    """generate_masked_orthogonal_rank_groups and RankGenerator from the
    source file, executed on their own."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    wanted = {"generate_masked_orthogonal_rank_groups": ast.FunctionDef,
              "RankGenerator": ast.ClassDef}
    body = [n for n in tree.body
            if isinstance(n, tuple(wanted.values())) and n.name in wanted]
    found = {n.name for n in body}
    missing = sorted(set(wanted) - found)
    if missing:
        sys.exit("megatron_oracle: %s lacks %s" % (path, ", ".join(missing)))
    module = ast.Module(body=body, type_ignores=[])
    ns = {name: getattr(typing, name) for name in ("List", "Optional", "Callable")}
    exec(compile(module, path, "exec"), ns)  # the cut definitions only
    return ns["RankGenerator"]


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def megatron_layout(RankGenerator, L):
    """Megatron's verdict on layout L: (True, groups) or (False, why)."""
    world = L["tp"] * L["cp"] * L["dp"] * L["pp"]
    etmp = L["etp"] * L["ep"] * L["pp"]
    if world % etmp:
        return False, "world %d not divisible by etp*ep*pp %d" % (world, etmp)
    edp = world // etmp
    order = L["order"]
    try:
        dense = RankGenerator(tp=L["tp"], ep=1, dp=L["dp"], pp=L["pp"], cp=L["cp"],
                              order=order)
        expert = RankGenerator(tp=L["etp"], ep=L["ep"], dp=edp, pp=L["pp"], cp=1,
                               order=order)
    except RuntimeError as e:
        return False, str(e)
    if not (order.endswith("pp") or L["pp"] == 1 or edp == L["dp"]):
        return False, "pp not last and edp %d != dp %d" % (edp, L["dp"])
    if dense.get_ranks("pp") != expert.get_ranks("pp"):
        return False, "pp groups differ"
    g = {}
    for tok, name in [("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"),
                      ("dp-cp", "dp_cp"), ("tp-cp", "tp_cp"), ("tp-pp", "tp_pp"),
                      ("tp-dp-cp", "tp_dp_cp")]:
        g[name] = dense.get_ranks(tok)
    for tok, name in [("tp", "etp"), ("ep", "ep"), ("dp", "edp"), ("tp-ep", "etp_ep"),
                      ("tp-ep-pp", "etp_ep_pp")]:
        g[name] = expert.get_ranks(tok)
    g["expert pp"] = expert.get_ranks("pp")
    return True, g


def random_layout(rng, max_world):
    while True:
        tp, cp, dp, pp = (rng.choice([1, 1, 2, 2, 3, 4, 8]) for _ in range(4))
        world = tp * cp * dp * pp
        if world <= max_world:
            break
    pick = rng.random()
    if pick < 0.8:  # mostly layouts where etp * ep * pp divides the world
        etp = rng.choice(divisors(world // pp))
        ep = rng.choice(divisors(world // pp // etp))
    else:
        etp = rng.choice([1, 2, 3, 4, 8])
        ep = rng.choice([1, 2, 3, 4, 8, 16])
    L = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "etp": etp, "ep": ep}
    dense_order = None
    L["default_order"] = rng.random() < 0.2
    if L["default_order"]:
        # meshpg's default: the mesh order with ep just inside dp.
        dense_order = rng.sample(["tp", "cp", "dp", "pp"], 4)
        toks = []
        for t in dense_order:
            if t == "dp":
                toks.append("ep")
            toks.append(t)
    else:
        if rng.random() < 0.5:  # pp last, Megatron's usual layout
            toks = rng.sample(["tp", "cp", "ep", "dp"], 4) + ["pp"]
        else:
            toks = rng.sample(TOKENS, 5)
        # Megatron lets an order leave out a token of size 1.  A dense
        # token of size > 1 is never left out (meshpg's --order names every
        # mesh dim); the expert grid's tp, ep, dp may then be > 1 and
        # Megatron (and meshpg) must refuse.
        if rng.random() < 0.3:
            toks = [t for t in toks
                    if not ((t == "ep" or L[t] == 1) and rng.random() < 0.5)]
    L["order"] = "-".join(toks)
    if dense_order is None:
        dense_order = [t for t in toks if t != "ep"]
        dense_order += [t for t in ["tp", "cp", "dp", "pp"] if t not in dense_order]
    L["dense_order"] = dense_order
    L["give_tp"] = etp != tp or rng.random() < 0.5
    return L


def meshpg_groups(meshpg, L):
    """(True, groups) or (False, stderr) from `meshpg plan --json`."""
    inner_first = L["dense_order"]
    mesh_order = list(reversed(inner_first))  # outermost first
    mesh = ",".join("%s=%d" % (t, L[t]) for t in mesh_order)
    args = [meshpg, "plan", "--json", "--mesh", mesh]
    for name, dims in [("dp_cp", ["dp", "cp"]), ("tp_cp", ["tp", "cp"]),
                       ("tp_pp", ["tp", "pp"]), ("tp_dp_cp", ["tp", "dp", "cp"])]:
        dims = sorted(dims, key=mesh_order.index)
        args += ["--flatten", "%s=%s" % (name, ",".join(dims))]
    ex = ["ep=%d" % L["ep"]]
    if L["give_tp"]:
        ex.append("tp=%d" % L["etp"])
    if not L["default_order"]:
        ex.append("order=" + L["order"])
    args += ["--experts", ",".join(ex)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode == 1:
        return False, r.stderr.strip(), args
    if r.returncode != 0:
        sys.exit("megatron_oracle: %s exited %d: %s" % (" ".join(args), r.returncode,
                                                          r.stderr))
    g = json.loads(r.stdout)["groups"]
    g["expert pp"] = g["pp"]
    return True, g, args


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshpg", default=os.environ.get("MESHPG_CLI", "build/tools/meshpg"))
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--max-world", type=int, default=256)
    ap.add_argument("--parallel-state", default=os.environ.get(ENV, ""))
    a = ap.parse_args()
    path = a.parallel_state
    if not path or not os.path.isfile(path) or not os.access(path, os.R_OK):
        print("megatron_oracle: skipped: set %s to a readable Megatron-LM "
              "megatron/core/parallel_state.py" % ENV)
        return SKIP
    RankGenerator = load_megatron(path)
    rng = random.Random(a.seed)
    agree = accepted = rejected = 0
    bad = []
    reasons = {}
    for i in range(a.count):
        L = random_layout(rng, a.max_world)
        ok_m, want = megatron_layout(RankGenerator, L)
        ok_p, got, args = meshpg_groups(a.meshpg, L)
        same = ok_m == ok_p
        if same and ok_m:
            diff = [k for k in want if want[k] != got.get(k)]
            same = not diff
            if diff:
                bad.append((L, args, "groups differ: %s (megatron %s, meshpg %s)" % (
                    ", ".join(diff), want[diff[0]], got.get(diff[0]))))
        elif not same:
            bad.append((L, args, "megatron %s (%s), meshpg %s (%s)" % (
                "accepts" if ok_m else "rejects", "" if ok_m else want,
                "accepts" if ok_p else "rejects", "" if ok_p else got)))
        if same:
            agree += 1
            accepted += ok_m
            rejected += not ok_m
            if not ok_m:
                why = ("divisibility" if "divisible" in want else
                       "token left out" if "specified the order" in want else
                       "pp not last, edp != dp" if "pp not last" in want else
                       "pp groups differ")
                reasons[why] = reasons.get(why, 0) + 1
    print("megatron_oracle: %d of %d layouts agree (%d accepted by both with every "
          "group equal, %d rejected by both); seed %d, %s" % (
              agree, a.count, accepted, rejected, a.seed, path))
    if reasons:
        print("  rejected by both: " + ", ".join(
            "%s %d" % (k, v) for k, v in sorted(reasons.items())))
    for L, args, why in bad[:10]:
        print("  DIFFERS: %s\n    %s\n    %s" % (
            {k: L[k] for k in ("tp", "cp", "dp", "pp", "etp", "ep", "order")},
            " ".join(args), why))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
