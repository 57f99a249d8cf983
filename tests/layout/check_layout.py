#!/usr/bin/env python3
"""The architecture, checked on the sources and the built objects.

usage: check_layout.py SOURCE_ROOT LIBMESHPG_A TOOLS_OBJECT_DIR

1. Layering: a library file includes headers of its own module or of the
   modules below it only (base -> mesh -> topo -> groups -> sync; base is
   mesh/base/; the public header and the generated mpg_config.h are
   everyone's), and another module's header only where DECLARED below says
   why and only from that module's exported directory (mesh/base,
   mesh/include, groups/include: the only ones the build puts on the
   include path of the modules above, meson.build).
2. No call cycles: in the library (read from the static archive) and in
   the meshpg program (its objects), the graph "file A uses a symbol that
   file B defines" has no cycle.
3. Size: no library source file, and no source or header of the meshpg
   program (tools/*.c, tools/*.h), is over 800 lines (a larger one mixes
   jobs and should be split), and no file of tests/ over 1,000.
4. Hands off the process: no object of the library calls a function that
   writes the environment (setenv, unsetenv, putenv, clearenv), ends the
   process (exit, _exit, _Exit, quick_exit, abort) or prints (printf, puts,
   perror, putchar, fprintf, vfprintf, fputs, fwrite) -- except the log
   (mesh/base/log.c), which prints only when MESHPG_LOG asks it to.
Prints every violation and exits 1 if there is any."""
import collections
import glob
import os
import re
import subprocess
import sys

MODULES = ["mesh/base", "mesh", "topo", "groups", "sync"]  # lowest first
# Each module's headers that the modules above may include.
EXPORTED = {"mesh/base": "mesh/base", "mesh": "mesh/include", "groups": "groups/include"}
MAX_LINES = 800
MAX_TEST_LINES = 1000  # a test source, header or worker


# Another module's internal header, by module: the only ones allowed, each
# with its reason.  A new cross-module include fails the check until it is
# declared here (or, better, the needed call goes through the public API).
DECLARED = {
    ("mesh", "mesh/base/internal.h"): "the library's error, ABI, log and hash helpers",
    ("topo", "mesh/base/internal.h"): "the library's error, ABI, log and hash helpers",
    ("groups", "mesh/base/internal.h"): "the library's error, ABI, log and hash helpers",
    ("sync", "mesh/base/internal.h"): "the library's error, ABI, log and hash helpers",
    ("topo", "mesh/include/mesh_internal.h"): "a mesh's dims by bit mask (placement)",
    ("groups", "mesh/include/mesh_internal.h"): "a dim set's mask and the expert grid (groups)",
    ("sync", "mesh/include/mesh_internal.h"): "a dim set's mask (reduce groups of params)",
    ("sync", "groups/include/groups_internal.h"): "the groups layer's calls for the sync "
                                                  "(f32-accumulating collectives, shm "
                                                  "segments, abort after a failed step)",
}


def module_of(path, root):
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    best = None
    for m in MODULES:
        if rel.startswith(m + "/") and (best is None or len(m) > len(best)):
            best = m
    return best


def library_files(root):
    seen = set()
    for m in MODULES:
        for dirpath, _, files in os.walk(os.path.join(root, m)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if f.endswith((".c", ".cc", ".h")) and path not in seen:
                    seen.add(path)
                    yield path


def check_includes(root, errors):
    headers = {}
    for path in library_files(root):
        if path.endswith(".h"):
            headers.setdefault(os.path.basename(path), []).append(path)
    for path in library_files(root):
        mod = module_of(path, root)
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            if inc in ("meshpg.h", "mpg_config.h"):
                continue
            here = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            cands = [here] if os.path.exists(here) else headers.get(os.path.basename(inc), [])
            if not cands:
                errors.append("%s:%d: includes \"%s\", which is no library header"
                              % (os.path.relpath(path, root), n, inc))
                continue
            owner = module_of(cands[0], root)
            if MODULES.index(owner) > MODULES.index(mod):
                errors.append("%s:%d: %s includes \"%s\" of %s, a module above it"
                              % (os.path.relpath(path, root), n, mod, inc, owner))
            elif owner != mod:
                rel = os.path.relpath(cands[0], root)
                if os.path.dirname(rel) != EXPORTED.get(owner):
                    errors.append("%s:%d: %s includes %s, a private header of %s (only %s/ "
                                  "is on the include path of the modules above)"
                                  % (os.path.relpath(path, root), n, mod, rel, owner,
                                     EXPORTED.get(owner, "none of it")))
                elif (mod, rel) not in DECLARED:
                    errors.append("%s:%d: %s includes %s, an internal header of %s that is "
                                  "not declared in DECLARED (tests/layout/check_layout.py)"
                                  % (os.path.relpath(path, root), n, mod, rel, owner))


def nm_members(args):
    """{member: (defined, undefined)} from nm over an archive or objects."""
    out = subprocess.run(["nm"] + args, capture_output=True, text=True, check=True).stdout
    members = {}
    cur = None
    if len(args) == 1 and not args[0].endswith(".a"):  # nm prints no header
        cur = args[0]
        members[cur] = (set(), set())
    for line in out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            cur = line[:-1]
            members[cur] = (set(), set())
            continue
        parts = line.split()
        if cur is None or not parts:
            continue
        if len(parts) == 3 and parts[1] in "TDBRCVW":
            members[cur][0].add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            members[cur][1].add(parts[1])
    return members


def check_cycles(what, members, errors):
    owner = {}
    for name, (defs, _) in members.items():
        for s in defs:
            owner[s] = name
    graph = collections.defaultdict(dict)
    for name, (_, undefs) in members.items():
        for s in undefs:
            o = owner.get(s)
            if o and o != name:
                graph[name].setdefault(o, s)
    # Tarjan's strongly connected components.
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(members):
        if v not in index:
            visit(v)
    for comp in comps:
        edges = ["%s -> %s (%s)" % (a, b, graph[a][b])
                 for a in sorted(comp) for b in sorted(graph[a]) if b in comp]
        errors.append("%s: files that call each other in a cycle: %s" % (what, "; ".join(edges)))


def tools_files(root):
    for pattern in ("*.c", "*.h"):
        yield from sorted(glob.glob(os.path.join(root, "tools", pattern)))


def check_sizes(root, errors):
    lib = [p for p in library_files(root) if p.endswith((".c", ".cc"))]
    tools = list(tools_files(root))
    if not tools:
        errors.append("no sources of the meshpg program in %s"
                      % os.path.join(root, "tools"))
    for path in lib + tools:
        n = sum(1 for _ in open(path, encoding="utf-8"))
        if n > MAX_LINES:
            errors.append("%s: %d lines (over %d: split it by job)"
                          % (os.path.relpath(path, root), n, MAX_LINES))
    for dirpath, _, files in os.walk(os.path.join(root, "tests")):
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cpp", ".hpp")):
                path = os.path.join(dirpath, f)
                n = sum(1 for _ in open(path, encoding="utf-8", errors="replace"))
                if n > MAX_TEST_LINES:
                    errors.append("%s: %d lines (a test file over %d: split it by topic)"
                                  % (os.path.relpath(path, root), n, MAX_TEST_LINES))


HANDS_OFF = {"setenv", "unsetenv", "putenv", "clearenv", "exit", "_exit", "_Exit",
             "quick_exit", "abort", "printf", "puts", "perror", "putchar", "fprintf",
             "vfprintf", "fputs", "fwrite"}
MAY_PRINT = {"mesh_base_log.c.o": {"fprintf", "vfprintf", "fputs", "fwrite"}}


def check_hands_off(members, errors):
    for name, (_, undefs) in sorted(members.items()):
        base = os.path.basename(name)
        for sym in sorted(undefs & HANDS_OFF):
            if sym not in MAY_PRINT.get(base, set()):
                errors.append("libmeshpg: %s calls %s (the library never writes the "
                              "environment, ends the process or prints)" % (base, sym))


def main():
    root, archive, tools_dir = sys.argv[1:4]
    errors = []
    check_includes(root, errors)
    lib_members = nm_members([archive])
    check_cycles("libmeshpg", lib_members, errors)
    check_hands_off(lib_members, errors)
    tools = sorted(glob.glob(os.path.join(tools_dir, "*.o")))
    if not tools:
        errors.append("no objects of the meshpg program in %s" % tools_dir)
    else:
        check_cycles("meshpg", {os.path.basename(o): d
                                for o, d in nm_members(tools).items()}, errors)
    check_sizes(root, errors)
    for e in errors:
        print(e)
    print("%d layout violations" % len(errors))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
