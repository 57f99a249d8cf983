#!/usr/bin/env python3
"""check_layout.py's rule 2b (no cycle between the files of a module) on
the planted trees of tests/layout/fixtures/ (README there): it fails on
two files whose headers include each other's, names both files and the
header of each edge, sees a cycle closed by a symbol, passes a room of its
own, honours ALLOWED_FILE_CYCLES exactly, and fails on a stale entry.

usage: test_file_cycles.py  (exits 1 with the failed expectations)"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_layout  # noqa: E402

FIX = os.path.join(HERE, "fixtures")
failures = []


def files_of(tree):
    root = os.path.join(FIX, tree)
    out = []
    for dirpath, _, names in os.walk(os.path.join(root, "mod")):
        for n in names:
            out.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
    return root, sorted(out)


def run(tree, **kw):
    root, files = files_of(tree)
    errors = []
    check_layout.check_file_cycles("mod", root, "mod", files, errors, **kw)
    return errors


def expect(cond, what, errors):
    if not cond:
        failures.append("%s; violations: %r" % (what, errors))


# The planted cycle: through the headers only.
errors = run("cycle")
expect(len(errors) == 1, "cycle/: one violation", errors)
text = errors[0] if errors else ""
expect('mod/alpha.c -> mod/beta.c (#include "beta_internal.h")' in text,
       "cycle/: names alpha.c -> beta.c and the header", errors)
expect('mod/beta.c -> mod/alpha.c (#include "alpha.h")' in text,
       "cycle/: names beta.c -> alpha.c and the header (beta_internal.h's include)", errors)

# A room of its own makes no cycle.
errors = run("rooms")
expect(errors == [], "rooms/: no violation", errors)
root, files = files_of("rooms")
_, graph = check_layout.file_graph(root, "mod", files)
expect(graph.get("mod/beta.c", {}).get("mod/alpha.c") == '#include "room.h" -> "alpha.h"',
       "rooms/: beta.c depends on alpha.c through room.h", dict(graph))
expect("mod/beta.c" not in graph.get("mod/alpha.c", {}),
       "rooms/: alpha.c does not depend on beta.c", dict(graph))

# A symbol closes the cycle that the text leaves open.
errors = run("rooms", sym_edges={"mod/alpha.c": {"mod/beta.c": "beta"}})
expect(len(errors) == 1 and "mod/alpha.c -> mod/beta.c (uses beta)" in errors[0],
       "rooms/ + a symbol edge: the cycle, with the symbol named", errors)

# The allow-list: a set that holds the cycle passes (a known cycle may
# shrink), a set that misses one of its files fails, a set that is gone
# fails.
pair = frozenset(["mod/alpha.c", "mod/beta.c"])
errors = run("cycle", allowed={pair: "planted"})
expect(errors == [], "cycle/ allowed exactly: no violation", errors)
errors = run("cycle", allowed={pair | {"mod/gamma.c"}: "planted, larger"})
expect(errors == [], "cycle/ inside a larger allowed set: no violation", errors)
errors = run("cycle", allowed={frozenset(["mod/alpha.c", "mod/gamma.c"]): "another"})
expect(len(errors) == 1 and "in a cycle" in errors[0],
       "cycle/ outside the allowed set: the cycle fails (the entry it touches is met)", errors)
errors = run("rooms", allowed={pair: "planted"})
expect(len(errors) == 1 and "is gone" in errors[0], "rooms/ with a stale entry: fails", errors)

# The header rule: X.h and X_internal.h belong to X.c; an exported
# directory's header to the module root's X.c; no X.c, or a header named
# for its directory or module (m/m_internal.h beside m/m.c): a room.
srcs = {"m/ctx.c", "m/sub/engine.c", "m/mesh.c", "m/m.c", "m/sub/sub.c"}
for hdr, owner in [("m/ctx_internal.h", "m/ctx.c"), ("m/ctx.h", "m/ctx.c"),
                   ("m/sub/engine.h", "m/sub/engine.c"), ("m/backend.h", None),
                   ("m/sub/ctx_internal.h", None), ("m/include/mesh_internal.h", "m/mesh.c"),
                   ("m/m_internal.h", None), ("m/include/m_internal.h", None),
                   ("m/sub/sub_internal.h", None)]:
    got = check_layout.header_owner(hdr, "m", srcs, exported="m/include")
    expect(got == owner, "header_owner(%s) is %s, not %s" % (hdr, owner, got), [])

for f in failures:
    print("FAIL:", f)
print("%d failed expectations" % len(failures))
sys.exit(1 if failures else 0)
