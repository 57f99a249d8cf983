#!/usr/bin/env python3
"""The architecture, checked on the sources and the built objects.

usage: check_layout.py SOURCE_ROOT LIBMESHPG_A TOOLS_OBJECTS...
  (TOOLS_OBJECTS: the meshpg program's object directory and archives)

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
2b. No cycle between the files of a module (each library module, and the
   meshpg program's tools/*.c), read from the text as well as the
   symbols: file A depends on file B when A uses a symbol B defines, or
   when A includes a header that belongs to B.  A header belongs to the .c
   of its stem in its own directory (X.h and X_internal.h belong to X.c;
   a header of the module's exported directory, mesh/include or
   groups/include, to the .c of its stem in the module's root); a header
   with no .c of its stem (backend.h, groups_internal.h, channel.h), and a
   header named for its directory or module (topo/topo_internal.h,
   mesh/include/mesh_internal.h: the directory's shared header, whatever
   file shares its name), is a room of its own: including it depends on nobody, but what it includes
   counts for the file that includes it, and what a header includes counts
   for the file it belongs to.  A cycle through a struct of a header or a
   function pointer, which nm cannot see, shows here (issue 47).  Each
   strongly connected component of two or more files is a violation that
   names the files and one edge each (the header or the symbol), unless
   ALLOWED_FILE_CYCLES names a set of files that holds the component, with
   its reason (a known cycle may shrink, never grow); an entry that no
   component meets any more is a violation too.
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


def symbol_graph(members):
    """{A: {B: symbol}}: member A uses `symbol`, which member B defines."""
    owner = {}
    for name, (defs, _) in members.items():
        for s in defs:
            owner[s] = name
    graph = collections.defaultdict(dict)
    for name, (_, undefs) in sorted(members.items()):
        for s in sorted(undefs):
            o = owner.get(s)
            if o and o != name:
                graph[name].setdefault(o, s)
    return graph


def strong_components(nodes, graph):
    """Tarjan's strongly connected components of two or more nodes."""
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

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [sorted(c) for c in comps]


def check_cycles(what, members, errors):
    graph = symbol_graph(members)
    for comp in strong_components(members, graph):
        edges = ["%s -> %s (%s)" % (a, b, graph[a][b])
                 for a in sorted(comp) for b in sorted(graph[a]) if b in comp]
        errors.append("%s: files that call each other in a cycle: %s" % (what, "; ".join(edges)))


# Cycles between the files of a module that the check knows and allows, by
# module: the set of files, and why it is still there.  A cycle may shrink
# inside its entry (a file leaves it), never grow: a component with a file
# outside every entry fails, and so does an entry that no component meets
# any more (the cycle is gone: remove the entry).
ALLOWED_FILE_CYCLES = {
}


def header_owner(hdr, mod_dir, sources, exported=None):
    """The .c (or .cc) a header belongs to, or None: a room of its own."""
    d, f = os.path.split(hdr)
    stem = os.path.splitext(f)[0]
    if stem.endswith("_internal"):
        stem = stem[:-len("_internal")]
    # Named for its directory (topo/topo_internal.h, groups/thread/
    # thread_internal.h) or, in the exported directory, for its module
    # (mesh/include/mesh_internal.h): the directory's shared header.
    if stem == os.path.basename(d) or (exported and d == exported
                                       and stem == os.path.basename(mod_dir)):
        return None
    dirs = [d] + ([mod_dir] if exported and d == exported else [])
    for dd in dirs:
        for ext in (".c", ".cc"):
            cand = "%s/%s%s" % (dd, stem, ext) if dd else stem + ext
            if cand in sources:
                return cand
    return None


def quoted_includes(path):
    out = []
    for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            out.append((n, m.group(1)))
    return out


def file_graph(root, mod_dir, files, exported=None, sym_edges=None):
    """{A: {B: why}} between the sources of one module (paths relative to
    root): A includes a header of B, or (sym_edges, {A: {B: symbol}}) A
    uses a symbol B defines."""
    files = sorted(files)
    sources = {f for f in files if f.endswith((".c", ".cc"))}
    headers = [f for f in files if f.endswith(".h")]
    by_name = collections.defaultdict(list)
    for h in headers:
        by_name[os.path.basename(h)].append(h)

    def resolve(frm, inc):
        here = os.path.normpath(os.path.join(os.path.dirname(frm), inc)).replace(os.sep, "/")
        if here in files:
            return here
        cands = by_name.get(os.path.basename(inc), [])
        return cands[0] if len(cands) == 1 else None

    owner = {h: header_owner(h, mod_dir, sources, exported) for h in headers}
    graph = collections.defaultdict(dict)
    for src in sorted(sources):
        # The file's own text: the source and the headers that belong to it.
        todo = [(src, ())] + [(h, ()) for h in headers if owner[h] == src]
        seen = set()
        while todo:
            cur, chain = todo.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            for _, inc in quoted_includes(os.path.join(root, cur)):
                hdr = resolve(cur, inc)
                if hdr is None:
                    continue  # another module's, or a system header
                via = chain + (inc,)
                o = owner[hdr]
                if o and o != src:
                    graph[src].setdefault(o, "#include " + " -> ".join('"%s"' % i for i in via))
                elif hdr not in seen:
                    todo.append((hdr, via))
    for a, outs in (sym_edges or {}).items():
        for b, sym in outs.items():
            if a in sources and b in sources and a != b:
                graph[a].setdefault(b, "uses " + sym)
    return sources, graph


def check_file_cycles(what, root, mod_dir, files, errors, exported=None, sym_edges=None,
                      allowed=None):
    """Violations for the cycles between the files of one module."""
    allowed = dict(allowed or {})
    unmet = set(allowed)
    sources, graph = file_graph(root, mod_dir, files, exported, sym_edges)
    for comp in strong_components(sources, graph):
        key = frozenset(comp)
        within = [k for k in allowed if key <= k]
        unmet -= {k for k in allowed if key & k}
        if within:
            continue
        edges = ["%s -> %s (%s)" % (a, b, graph[a][b])
                 for a in comp for b in sorted(graph[a]) if b in key]
        errors.append("%s: files that depend on each other in a cycle (a header of one "
                      "included by the other, or a symbol): %s" % (what, "; ".join(edges)))
    for key, why in sorted(((k, allowed[k]) for k in unmet), key=lambda kv: sorted(kv[0])):
        errors.append("%s: ALLOWED_FILE_CYCLES names a cycle that is gone (%s: %s): remove "
                      "it (tests/layout/check_layout.py)" % (what, ", ".join(sorted(key)), why))


def member_source(name, by_object):
    return by_object.get(os.path.basename(name))


def module_file_cycles(root, lib_members, tools_members, errors):
    """The rule 2b over every library module and over tools/."""
    lib_by_object = {}
    per_module = collections.defaultdict(list)
    for path in library_files(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        per_module[module_of(path, root)].append(rel)
        lib_by_object[rel.replace("/", "_") + ".o"] = rel
    tools = [os.path.relpath(p, root).replace(os.sep, "/") for p in tools_files(root)]
    tools_by_object = {os.path.basename(t) + ".o": t for t in tools}

    def sym_edges(members, by_object):
        out = collections.defaultdict(dict)
        for a, outs in symbol_graph(members).items():
            sa = member_source(a, by_object)
            for b, sym in outs.items():
                sb = member_source(b, by_object)
                if sa and sb:
                    out[sa].setdefault(sb, sym)
        return out

    lib_edges = sym_edges(lib_members, lib_by_object)
    for mod in MODULES:
        check_file_cycles(mod, root, mod, per_module[mod], errors,
                          exported=EXPORTED.get(mod), sym_edges=lib_edges,
                          allowed=ALLOWED_FILE_CYCLES.get(mod))
    check_file_cycles("tools", root, "tools", tools, errors,
                      sym_edges=sym_edges(tools_members, tools_by_object),
                      allowed=ALLOWED_FILE_CYCLES.get("tools"))


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


def tools_members(paths, errors):
    """The meshpg program's objects (directories of .o, static archives),
    by object name."""
    members = {}
    for p in paths:
        objs = [p] if p.endswith(".a") else sorted(glob.glob(os.path.join(p, "*.o")))
        if not objs:
            errors.append("no objects of the meshpg program in %s" % p)
            continue
        members.update({os.path.basename(o): d for o, d in nm_members(objs).items()})
    return members


def main():
    root, archive = sys.argv[1:3]
    errors = []
    check_includes(root, errors)
    lib_members = nm_members([archive])
    check_cycles("libmeshpg", lib_members, errors)
    check_hands_off(lib_members, errors)
    tools = tools_members(sys.argv[3:], errors)
    if tools:
        check_cycles("meshpg", tools, errors)
    module_file_cycles(root, lib_members, tools, errors)
    check_sizes(root, errors)
    for e in errors:
        print(e)
    print("%d layout violations" % len(errors))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
