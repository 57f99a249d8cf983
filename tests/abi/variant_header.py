#!/usr/bin/env python3
"""Write a copy of include/meshpg.h whose versioned structs are one field
shorter ("short": as a program built against an older header sees them) or
one field longer ("long": as a program built against a newer header), with
their initializer macros to match.

usage: variant_header.py short|long IN OUT

The appended field of "long" is `int abi_appended` initialised to 7, a
non-zero value this library cannot know.  The copy defines
MPG_ABI_VARIANT_SHORT or MPG_ABI_VARIANT_LONG so a caller can tell."""
import re
import sys

# Every versioned struct of the public API and its initializer macro.
STRUCTS = [
    ("mpg_spec", "MPG_SPEC_INIT"),
    ("mpg_nic_info", "MPG_NIC_INFO_INIT"),
    ("mpg_gpu_info", "MPG_GPU_INFO_INIT"),
    ("mpg_binding", "MPG_BINDING_INIT"),
    ("mpg_placement_opts", "MPG_PLACEMENT_OPTS_INIT"),
    ("mpg_init_opts", "MPG_INIT_OPTS_INIT"),
    ("mpg_launch", "MPG_LAUNCH_INIT"),
    ("mpg_sync_opts", "MPG_SYNC_OPTS_INIT"),
    ("mpg_param_opts", "MPG_PARAM_OPTS_INIT"),
    ("mpg_sync_stats", "MPG_SYNC_STATS_INIT"),
    ("mpg_shard_info", "MPG_SHARD_INFO_INIT"),
]


def code_lines(lines):
    """The lines with every /* comment */ blanked, even across lines."""
    text = "\n".join(lines)
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.S)
    return text.split("\n")


def edit_struct(text, name, mode):
    m = re.search(r"^(typedef )?struct %s \{\n" % name, text, re.M)
    if not m:
        sys.exit("variant_header: struct %s not found" % name)
    end = text.index("\n}", m.end())
    body = text[m.end():end].split("\n")
    if mode == "long":
        body.append("  int abi_appended; /* appended by tests/abi/variant_header.py */")
    else:
        # The last declaration: the last line whose code (comments removed)
        # holds a ';', plus the comment lines that continue it.
        code = code_lines(body)
        decl = max(i for i, l in enumerate(code) if ";" in l)
        # The declaration may start on an earlier line (none does today).
        body = body[:decl]
    return text[:m.end()] + "\n".join(body) + text[end:]


def edit_init(text, macro, mode):
    m = re.search(r"^#define %s\b" % macro, text, re.M)
    if not m:
        sys.exit("variant_header: macro %s not found" % macro)
    # The macro's extent: up to the first line not ending in a backslash.
    end = m.start()
    while True:
        nl = text.index("\n", end)
        if not text[end:nl].rstrip().endswith("\\"):
            break
        end = nl + 1
    macro_text = text[m.start():nl]
    close = macro_text.rindex("}")
    if mode == "long":
        new = macro_text[:close].rstrip(" \\\n") + ", 7 }" + macro_text[close + 1:]
    else:
        # Drop the last top-level element of the outer braces.
        open_ = macro_text.index("{")
        depth, last_comma = 0, None
        for i in range(open_ + 1, close):
            c = macro_text[i]
            if c in "{(":
                depth += 1
            elif c in "})":
                depth -= 1
            elif c == "," and depth == 0:
                last_comma = i
        new = macro_text[:last_comma] + " }" + macro_text[close + 1:]
    return text[:m.start()] + new + text[nl:]


def main():
    mode, src, dst = sys.argv[1:4]
    if mode not in ("short", "long"):
        sys.exit("usage: variant_header.py short|long IN OUT")
    text = open(src).read()
    for name, macro in STRUCTS:
        text = edit_struct(text, name, mode)
        text = edit_init(text, macro, mode)
    flag = "#define MPG_ABI_VARIANT_%s 1\n" % mode.upper()
    text = text.replace("#define MESHPG_H\n", "#define MESHPG_H\n" + flag, 1)
    open(dst, "w").write(text)


if __name__ == "__main__":
    main()
