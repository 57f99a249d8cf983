#!/usr/bin/env python3
"""Docs that cannot drift: README.md and docs/ checked against the code.

    check_docs.py CHECK SOURCE_DIR [CC...]

CHECK is one of
  keys   every TOML key the spec loader accepts (the only_keys(...) lists of
         mesh/spec_toml.cc) is in a reference table of docs/ (the key tables
         of docs/spec.md and docs/pipeline-and-experts.md), and every key
         those tables name is accepted by the loader, and a quoted
         "unknown key ... expected one of ..." error lists every key of its
         section;
  cli    every flag of `meshpg CMD --help` (the program is $MESHPG_CLI) is
         named in the sections of docs/cli.md about `meshpg CMD`, and every
         flag of those sections' tables is in the help text;
  env    every MESHPG_* environment variable the sources read (library,
         tools, examples, bench and tests: getenv/setenv string literals in
         C/C++, ${MESHPG_...} in shell scripts) is in the environment table
         of docs/launchers.md, and every MESHPG_* variable the table names
         is read somewhere;
  links  every relative link and #anchor in README.md and docs/*.md
         resolves (GitHub anchors: lowercase, punctuation dropped, spaces to
         '-', a repeated heading gets -1, -2, ...), and every NAME.md the
         examples, the public headers, the man pages and the meshpg program
         mention exists;
  c      every ```c block of README.md and docs/*.md compiles against
         include/meshpg.h (CC -fsyntax-only -std=c11 -I include).  A block
         with `main(` at the start of a line is a whole file; any other block
         is a fragment: its #include lines go first, the rest becomes the
         body of a function, so a fragment declares what it uses (its
         "Given:" lines).  A block right after a line `<!-- fragment -->` is
         not compiled (keep that rare).
  man    the man page sources: man/meshpg.1.scd names every flag of every
         `meshpg CMD --help` and no other, man/meshpg-spec.5.scd every key
         the loader accepts under its `# [section]`, and man/meshpg.3.scd
         every function the header exports (MPG_API) and no other;
  hello  the first ```c block of README.md ("A first program") is
         examples/hello/hello.c, byte for byte (the tests build and run
         that file);
  header include/meshpg.h is a contract: the comment right before each
         MPG_API function is at most 12 lines, every function has one, and
         no comment carries history ("Appended", "Changes from");
  names  every mpg_/MPG_ identifier that include/meshpg.h (its comments),
         include/meshpg.hpp, README.md, docs/*.md and man/* name is declared
         by meshpg.h (after the preprocessor: the status enum comes from a
         macro list) or meshpg.hpp, and every `mpg_struct.field` names a
         field of that struct.  A name ending in `_` is a prefix (mpg_spec_
         load_*): some identifier must start with it.  Paragraphs that start
         with "Changes from" (release history) are not checked.  Internal
         mpg__ names and file names (mpg_config.h) are not identifiers;
  counts every count the prose of README.md, docs/*.md and man/* gives in
         words or digits is the code's: "N versioned structs" and "its
         initializer macro, N in all" (the MPG_*_MAGIC structs of
         include/meshpg.h), "covers N of the M" (tests/abi's STRUCTS list
         against those), "N keys are the fields of `mpg_X_settings`" (the
         keys the loader accepts in [X]); any other "N structs" or "N keys"
         is a problem, so that a new count is made checkable here.
Exit 0 when the check passes, 1 with one line per problem otherwise.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

problems = []


def problem(msg):
    problems.append(msg)


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def md_files(src):
    return [os.path.join(src, 'README.md')] + sorted(glob.glob(os.path.join(src, 'docs', '*.md')))


def strip_fences(text):
    """Lines outside ``` fences, with their 1-based numbers."""
    out, fence = [], False
    for i, line in enumerate(text.split('\n'), 1):
        if line.lstrip().startswith('```'):
            fence = not fence
            continue
        if not fence:
            out.append((i, line))
    return out


def tables(text):
    """(heading, header cells, rows) of every markdown table outside fences;
    heading is the nearest heading above the table."""
    res, heading, cur = [], '', None
    for _, line in strip_fences(text):
        m = re.match(r'^#+ (.*)', line)
        if m:
            heading = m.group(1)
        if line.startswith('|'):
            cells = split_row(line)
            if cur is None:
                cur = (heading, cells, [])
                res.append(cur)
            elif not all(re.fullmatch(r':?-+:?', c.strip()) for c in cells):
                cur[2].append(cells)
        else:
            cur = None
    return res


def split_row(line):
    line = line.strip().strip('|')
    return [c.strip() for c in re.split(r'(?<!\\)\|', line)]


def code_spans(cell):
    return re.findall(r'`([^`]+)`', cell)


# --------------------------------------------------------------------------
def accepted_keys(src):
    code = read(os.path.join(src, 'mesh', 'spec_toml.cc'))
    accepted = {}  # section -> set of keys
    for m in re.finditer(r'only_keys\(\s*\w+\s*,\s*([^,]+?)\s*,\s*\{([^}]*)\}', code):
        where = m.group(1).strip()
        keys = set(re.findall(r'"([^"]+)"', m.group(2)))
        if where == '""':
            accepted[''] = keys
        elif where.startswith('"'):
            accepted[where.strip('"')] = keys
        else:  # a computed path: the entries of [mesh] dims
            accepted['mesh.dims[]'] = keys
    for sec in ('', 'mesh', 'topology', 'sync', 'backend', 'experts', 'mesh.dims[]'):
        if sec not in accepted:
            problem(f'mesh/spec_toml.cc: no only_keys list found for "{sec}" '
                    '(the parser of this check needs updating)')
    return accepted


def check_keys(src):
    accepted = accepted_keys(src)
    documented = {}  # section -> set of keys in docs tables
    pages = {'spec.md': None, 'pipeline-and-experts.md': 'experts'}
    all_text = ''
    for page, fixed in pages.items():
        text = read(os.path.join(src, 'docs', page))
        all_text += text
        for heading, header, rows in tables(text):
            if not header or header[0].strip().lower() != 'key':
                continue
            sec = fixed
            m = re.search(r'`\[(\w+)\]`', heading)
            if m:
                sec = m.group(1)
            if sec is None:
                problem(f'docs/{page}: a key table under "{heading}" names no `[section]`')
                continue
            for cells in rows:
                spans = code_spans(cells[0])
                if not spans:
                    continue
                documented.setdefault(sec, set()).add(spans[0])
                if sec == 'mesh' and spans[0] == 'dims':
                    documented['mesh.dims[]'] = set(re.findall(r'\b(\w+)\b', ' '.join(
                        re.findall(r'\{([^}]*)\}', ' '.join(cells[1:])))))
    for sec, keys in sorted(accepted.items()):
        if sec == '':
            for k in sorted(keys):
                if f'`[{k}]`' not in all_text:
                    problem(f'docs/spec.md: the section [{k}] the loader accepts is not documented')
            continue
        for k in sorted(keys - documented.get(sec, set())):
            problem(f'docs: the key {sec}.{k} (mesh/spec_toml.cc) is in no key table of docs/')
        for k in sorted(documented.get(sec, set()) - keys):
            problem(f'docs: the key table of [{sec}] names "{k}", which the loader does not accept')
    for sec in sorted(set(documented) - set(accepted)):
        problem(f'docs: a key table documents [{sec}], a section the loader does not know')
    # A quoted "unknown key" error lists every key of its section.
    for page in pages:
        text = read(os.path.join(src, 'docs', page))
        for m in re.finditer(r'(\w+)\.\w+: unknown key[^`]*?expected one of ([\w,\s]+)`', text):
            listed = set(re.findall(r'\w+', m.group(2)))
            want = accepted.get(m.group(1), set())
            if listed != want:
                problem(f'docs/{page}: an example error lists the [{m.group(1)}] keys '
                        f'{sorted(listed)}, but the loader accepts {sorted(want)}')


# --------------------------------------------------------------------------
def help_flags():
    """{command: set of flags} from `meshpg CMD --help`; None without a CLI."""
    cli = os.environ.get('MESHPG_CLI')
    if not cli or not os.access(cli, os.X_OK):
        problem(f'MESHPG_CLI is not an executable meshpg program: {cli!r}')
        return None
    top = subprocess.run([cli, '--help'], capture_output=True, text=True)
    help_top = top.stdout + top.stderr
    cmds = re.findall(r'^\s{2}(\w+)\s{2,}', help_top.split('commands:', 1)[-1], re.M)
    if not cmds:
        problem(f'`meshpg --help` lists no commands:\n{help_top}')
    res = {}
    for cmd in cmds:
        r = subprocess.run([cli, cmd, '--help'], capture_output=True, text=True)
        h = r.stdout + r.stderr
        res[cmd] = set(re.findall(r'(?<![\w-])(--[a-z][a-z0-9-]*)', h)) - {'--help'}
        if not res[cmd]:
            problem(f'`meshpg {cmd} --help` names no flag:\n{h}')
    return res


def check_man(src):
    man = os.path.join(src, 'man')
    # meshpg(3): the exported functions.
    header = read(os.path.join(src, 'include', 'meshpg.h'))
    exported = set(re.findall(r'^MPG_API [^(]*?\b(mpg_\w+)\s*\(', header, re.M))
    page3 = read(os.path.join(man, 'meshpg.3.scd'))
    listed = set(re.findall(r'\*(mpg_\w+)\*\(\)', page3))
    for f in sorted(exported - listed):
        problem(f'man/meshpg.3.scd: the exported function {f} is not in the index')
    for f in sorted(listed - exported):
        problem(f'man/meshpg.3.scd: lists {f}(), which include/meshpg.h does not export')
    # meshpg-spec(5): every key under its section.
    page5 = read(os.path.join(man, 'meshpg-spec.5.scd'))
    sections, cur = {}, None
    for line in page5.split('\n'):
        m = re.match(r'^# \[(\w+)\]', line)
        if m:
            cur = m.group(1)
        elif line.startswith('# '):
            cur = None
        elif cur:
            sections.setdefault(cur, set()).update(re.findall(r'^\*(\w+)\*', line))
    for sec, keys in sorted(accepted_keys(src).items()):
        if sec in ('', 'mesh.dims[]'):
            continue
        for k in sorted(keys - sections.get(sec, set())):
            problem(f'man/meshpg-spec.5.scd: the key {sec}.{k} is not described under # [{sec}]')
        for k in sorted(sections.get(sec, set()) - keys):
            problem(f'man/meshpg-spec.5.scd: # [{sec}] describes "{k}", '
                    'which the loader does not accept')
    # meshpg(1): every flag of every command in its section, and no other.
    flags = help_flags()
    if flags is None:
        return
    page1 = read(os.path.join(man, 'meshpg.1.scd'))
    known = set().union(*flags.values()) | {'--help', '--version'}
    named = set(re.findall(r'\*(--[a-z][a-z0-9-]*)\*', page1))
    for cmd, fl in sorted(flags.items()):
        m = re.search(r'^## meshpg ' + cmd + r'\n(.*?)(?=^#)', page1, re.M | re.S)
        body = m.group(1) if m else ''
        if not body:
            problem(f'man/meshpg.1.scd: no section "## meshpg {cmd}"')
        for f in sorted(fl):
            if f'*{f}*' not in body:
                problem(f'man/meshpg.1.scd: `meshpg {cmd}` flag {f} is not described in its section')
    for f in sorted(named - known):
        problem(f'man/meshpg.1.scd: names {f}, which no `meshpg CMD --help` knows')


def check_cli(src):
    flags_of = help_flags()
    if flags_of is None:
        return
    text = read(os.path.join(src, 'docs', 'cli.md'))
    # The sections of each command: headings that name `meshpg CMD`, down to
    # the next heading of the same or a higher level.
    sections = {}
    cur, cur_level = None, 0
    for _, line in strip_fences(text):
        m = re.match(r'^(#+) (.*)', line)
        if m:
            level = len(m.group(1))
            c = re.search(r'`meshpg (\w+)`', m.group(2))
            if c:
                cur, cur_level = c.group(1), level
            elif cur and level <= cur_level:
                cur = None
            continue
        if cur:
            sections.setdefault(cur, []).append(line)
    for cmd, flags in sorted(flags_of.items()):
        body = '\n'.join(sections.get(cmd, []))
        if not body:
            problem(f'docs/cli.md: no section headed `meshpg {cmd}`')
            continue
        for f in sorted(flags):
            if not re.search(r'(?<![\w-])' + re.escape(f) + r'(?![\w-])', body):
                problem(f'docs/cli.md: `meshpg {cmd}` flag {f} (in its --help) is not documented')
        for _, header, rows in tables(body):
            if header[0].strip().lower() != 'flag':
                continue
            for cells in rows:
                for span in code_spans(cells[0]):
                    for f in re.findall(r'^(--[a-z][a-z0-9-]*)', span):
                        if f != '--help' and f not in flags:
                            problem(f'docs/cli.md: the table of `meshpg {cmd}` names {f}, '
                                    f'which `meshpg {cmd} --help` does not know')


# --------------------------------------------------------------------------
ENV_DIRS = ('mesh', 'topo', 'groups', 'sync', 'tools', 'examples', 'bench', 'tests', '.ci')


def env_read(src):
    """MESHPG_* variables the sources read: name -> first file."""
    found = {}
    for d in ENV_DIRS:
        for root, _, files in os.walk(os.path.join(src, d)):
            for f in files:
                p = os.path.join(root, f)
                rel = os.path.relpath(p, src)
                if f.endswith(('.c', '.cc', '.cpp', '.h', '.hpp', '.cu')):
                    pat = r'"(MESHPG_[A-Z0-9_]+)"'
                elif f.endswith(('.sh', '.py')) or f == 'run':
                    pat = r'\$\{?(MESHPG_[A-Z0-9_]+)|environ(?:\.get\(|\[)\s*["\'](MESHPG_[A-Z0-9_]+)'
                else:
                    continue
                if rel.startswith(os.path.join('tests', 'docs')):
                    continue
                try:
                    text = read(p)
                except UnicodeDecodeError:
                    continue
                for m in re.finditer(pat, text):
                    name = next(g for g in m.groups() if g)
                    found.setdefault(name, rel)
    return found


def check_env(src):
    code = env_read(src)
    text = read(os.path.join(src, 'docs', 'launchers.md'))
    table = [t for t in tables(text) if t[1] and t[1][0].strip().lower() == 'variable']
    if not table:
        problem('docs/launchers.md: no table with a first column "variable"')
        return
    documented = set()
    for _, _, rows in table:
        for cells in rows:
            for span in code_spans(cells[0]):
                if re.fullmatch(r'MESHPG_[A-Z0-9_]+', span):
                    documented.add(span)
    for name in sorted(set(code) - documented):
        problem(f'docs/launchers.md: {name} (read by {code[name]}) is not in the '
                'environment variable table')
    for name in sorted(documented - set(code)):
        problem(f'docs/launchers.md: the table names {name}, which no source reads')


# --------------------------------------------------------------------------
def gh_anchor(heading):
    h = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading).strip().lower()
    h = re.sub(r'[^\w\- ]', '', h)
    return h.replace(' ', '-')


def anchors(text):
    seen, res = {}, set()
    for _, line in strip_fences(text):
        m = re.match(r'^#+ (.*)', line)
        if not m:
            continue
        a = gh_anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        res.add(a if n == 0 else f'{a}-{n}')
    return res


def check_md_mentions(src):
    """Every NAME.md that the examples, the public headers, the man pages and
    the meshpg program mention exists in the source tree (a user's clone)."""
    paths = []
    for pattern in ('examples/*.toml', 'examples/*.cpp', 'examples/*/*.c', 'examples/*/*.h',
                    'include/*.h', 'include/*.hpp', 'man/*', 'tools/*.c', 'tools/*.h'):
        paths += sorted(glob.glob(os.path.join(src, pattern)))
    for path in paths:
        for n, line in enumerate(read(path).split('\n'), 1):
            for m in re.finditer(r'(?<![\w./-])([\w./-]+\.md)\b', line):
                name = m.group(1)
                cands = [os.path.join(src, name), os.path.join(src, 'docs', name)]
                if not any(os.path.exists(c) for c in cands):
                    problem(f'{os.path.relpath(path, src)}:{n}: mentions {name}, which is not '
                            'in the source tree')


def check_links(src):
    cache = {}
    for p in md_files(src):
        rel = os.path.relpath(p, src)
        text = read(p)
        for lineno, line in strip_fences(text):
            line = re.sub(r'`[^`]*`', '', line)
            for m in re.finditer(r'\[[^\]]*\]\(([^)\s]+)\)', line):
                target = m.group(1)
                if re.match(r'[a-z]+:', target):
                    continue
                path, _, frag = target.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(p), path)) if path else p
                if not os.path.exists(dest):
                    problem(f'{rel}:{lineno}: link to {target}: {os.path.relpath(dest, src)} does not exist')
                    continue
                if frag and dest.endswith('.md'):
                    if dest not in cache:
                        cache[dest] = anchors(read(dest))
                    if frag not in cache[dest]:
                        problem(f'{rel}:{lineno}: link to {target}: no heading with anchor '
                                f'#{frag} in {os.path.relpath(dest, src)}')


# --------------------------------------------------------------------------
def c_blocks(text):
    """(first line, code, skipped) of every ```c block."""
    lines = text.split('\n')
    res, i = [], 0
    while i < len(lines):
        if lines[i].strip() == '```c':
            indent = len(lines[i]) - len(lines[i].lstrip())
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            skip = k >= 0 and lines[k].strip() == '<!-- fragment -->'
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith('```'):
                j += 1
            res.append((i + 1, '\n'.join(l[indent:] for l in lines[i + 1:j]), skip))
            i = j
        i += 1
    return res


def check_c(src, cc):
    inc = os.path.join(src, 'include')
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for p in md_files(src):
            rel = os.path.relpath(p, src)
            for lineno, code, skip in c_blocks(read(p)):
                if skip:
                    continue
                n += 1
                if re.search(r'^\w.*\bmain\s*\(', code, re.M):
                    unit = code
                else:
                    incs = [l for l in code.split('\n') if l.startswith('#include')]
                    body = [l for l in code.split('\n') if not l.startswith('#include')]
                    unit = '\n'.join(['#include <meshpg.h>', '#include <stdio.h>',
                                      '#include <stdlib.h>', '#include <string.h>'] + incs +
                                     [f'void doc_fragment_{n}(void);',
                                      f'void doc_fragment_{n}(void) {{'] +
                                     [f'#line {lineno + 1 + i} "{rel}"\n{l}' if i == 0 else l
                                      for i, l in enumerate(body)] + ['}'])
                f = os.path.join(tmp, f'block{n}.c')
                with open(f, 'w') as out:
                    out.write(unit + '\n')
                r = subprocess.run(cc + ['-fsyntax-only', '-std=c11', '-I', inc,
                                    '-Werror=implicit-function-declaration', '-Werror=implicit-int',
                                    '-Werror=int-conversion', '-Werror=incompatible-pointer-types',
                                    f], capture_output=True, text=True)
                if r.returncode != 0:
                    problem(f'{rel}:{lineno}: the ```c block does not compile against '
                            f'include/meshpg.h:\n{r.stderr.strip()}')
    if n == 0:
        problem('no ```c block found in README.md and docs/')
    print(f'{n} C blocks compiled')


def strip_c_comments(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    return re.sub(r'//[^\n]*', ' ', text)


def declared_names(src, cc):
    """(identifiers, {struct: fields}) that the public headers declare."""
    hdr = os.path.join(src, 'include', 'meshpg.h')
    out = subprocess.run(cc + ['-E', '-dD', '-P', hdr], capture_output=True, text=True)
    if out.returncode != 0:
        problem(f'{" ".join(cc)} -E {hdr} failed: {out.stderr.strip()}')
        return set(), {}
    code = out.stdout + strip_c_comments(read(os.path.join(src, 'include', 'meshpg.hpp')))
    ids = set(re.findall(r'\b(?:mpg|MPG)_\w+', code))
    fields = {}
    # typedef struct mpg_x { ... } mpg_x;  and  struct mpg_x { ... };
    for m in re.finditer(r'(?:typedef\s+)?struct\s+(mpg_\w+)\s*\{(.*?)\}\s*(mpg_\w+)?\s*;',
                         code, re.S):
        body = m.group(2)
        names = set(re.findall(r'(\w+)\s*(?:\[[^\]]*\])?\s*;', body))
        names |= set(re.findall(r'\(\s*\*\s*(\w+)\s*\)', body))
        fields[m.group(3) or m.group(1)] = names
    return ids, fields


def without_history(text):
    """text with every paragraph that starts with "Changes from" blanked
    (line numbers kept)."""
    out, skip = [], False
    for line in text.split('\n'):
        if not line.strip():
            skip = False
        elif line.startswith('Changes from'):
            skip = True
        out.append('' if skip else line)
    return '\n'.join(out)


def check_names(src, cc):
    ids, fields = declared_names(src, cc)
    if not ids:
        problem('no mpg_ identifiers found in include/meshpg.h')
        return
    paths = [os.path.join(src, 'include', 'meshpg.h'), os.path.join(src, 'include', 'meshpg.hpp')]
    paths += md_files(src) + sorted(glob.glob(os.path.join(src, 'man', '*')))
    for path in paths:
        text = without_history(read(path))
        rel = os.path.relpath(path, src)
        for m in re.finditer(r'\b((?:mpg|MPG)_(?!_)\w*)(?:\.([A-Za-z_]\w*))?', text):
            name, field = m.group(1), m.group(2)
            line = text.count('\n', 0, m.start()) + 1
            if field in ('h', 'c', 'hpp', 'cc', 'map', 'so', 'a'):
                continue
            if name.endswith('_'):
                if not any(i.startswith(name) for i in ids):
                    problem(f'{rel}:{line}: no identifier starts with "{name}"')
                continue
            if name not in ids:
                problem(f'{rel}:{line}: "{name}" is not declared by include/meshpg.h')
            elif field and name in fields and field not in fields[name]:
                problem(f'{rel}:{line}: "{name}.{field}": {name} has no field "{field}"')


MAX_CONTRACT_LINES = 12


def check_header(src):
    lines = read(os.path.join(src, 'include', 'meshpg.h')).split('\n')
    for i, line in enumerate(lines):
        if re.search(r'\b(Appended|Changes from)\b', line):
            problem(f'include/meshpg.h:{i + 1}: history in a comment: {line.strip()}')
        m = re.match(r'MPG_API\b[^(]*?\b(mpg_\w+)\s*\(', line)
        if not m:
            continue
        j = i - 1
        if j < 0 or not lines[j].rstrip().endswith('*/'):
            problem(f'include/meshpg.h:{i + 1}: {m.group(1)} has no comment right before it')
            continue
        k = j
        while k >= 0 and '/*' not in lines[k]:
            k -= 1
        if j - k + 1 > MAX_CONTRACT_LINES:
            problem(f'include/meshpg.h:{i + 1}: the comment of {m.group(1)} has {j - k + 1} '
                    f'lines (at most {MAX_CONTRACT_LINES}: how it works goes to docs/)')


def check_hello(src):
    text = read(os.path.join(src, 'README.md'))
    m = re.search(r'## A first program.*?```c\n(.*?)```', text, re.S)
    if not m:
        problem('README.md: no ```c block under "## A first program"')
        return
    if m.group(1) != read(os.path.join(src, 'examples', 'hello', 'hello.c')):
        problem('README.md: the first program differs from examples/hello/hello.c '
                '(copy the file into the README)')


NUMBER_WORDS = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight',
                'nine', 'ten', 'eleven', 'twelve', 'thirteen', 'fourteen', 'fifteen',
                'sixteen', 'seventeen', 'eighteen', 'nineteen', 'twenty']
NUM = r'(\d+|' + '|'.join(NUMBER_WORDS) + r')'


def number(word):
    w = word.lower()
    return int(w) if w.isdigit() else NUMBER_WORDS.index(w)


def check_counts(src):
    header = read(os.path.join(src, 'include', 'meshpg.h'))
    nstructs = len(re.findall(r'#define MPG_\w+_MAGIC 0x', header))
    abi = read(os.path.join(src, 'tests', 'abi', 'variant_header.py'))
    m = re.search(r'STRUCTS = \[(.*?)\]', abi, re.S)
    nabi = len(re.findall(r'\("mpg_\w+", "MPG_\w+_INIT"\)', m.group(1))) if m else -1
    keys = accepted_keys(src)
    files = md_files(src) + sorted(glob.glob(os.path.join(src, 'man', '*.scd')))
    for path in files:
        rel = os.path.relpath(path, src)
        text = re.sub(r'\s+', ' ', ' '.join(line for _, line in strip_fences(read(path))))
        seen = set()

        def expect(m, got, want, what):
            seen.add(m.start())
            if got != want:
                problem(f'{rel}: "{m.group(0)}" says {got}, but {what} is {want}')
        for m in re.finditer(r'\b' + NUM + r' versioned structs\b', text, re.I):
            expect(m, number(m.group(1)), nstructs, 'the number of MPG_*_MAGIC structs of '
                   'include/meshpg.h')
        for m in re.finditer(r'initializer macro, ' + NUM + r' in all', text, re.I):
            expect(m, number(m.group(1)), nstructs, 'the number of MPG_*_MAGIC structs of '
                   'include/meshpg.h')
        for m in re.finditer(r'covers ' + NUM + r' of the ' + NUM + r'\b', text, re.I):
            expect(m, number(m.group(1)), nabi, "tests/abi/variant_header.py's STRUCTS")
            expect(m, number(m.group(2)), nstructs, 'the number of versioned structs')
        for m in re.finditer(r'\b' + NUM + r' keys are the fields of `mpg_(\w+)_settings`',
                             text, re.I):
            expect(m, number(m.group(1)), len(keys.get(m.group(2), ())),
                   f'the number of keys mesh/spec_toml.cc accepts in [{m.group(2)}]')
        for m in re.finditer(r'\b' + NUM + r' (?:\w+ )?(structs|keys)\b', text, re.I):
            if not any(abs(m.start() - k) < 40 for k in seen):
                problem(f'{rel}: "{m.group(0)}": a count this check cannot verify (say it in '
                        'one of the forms of check_docs.py "counts", or teach it the new form)')


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    check, src = sys.argv[1], sys.argv[2]
    if check == 'man':
        check_man(src)
    elif check == 'keys':
        check_keys(src)
    elif check == 'cli':
        check_cli(src)
    elif check == 'env':
        check_env(src)
    elif check == 'links':
        check_links(src)
        check_md_mentions(src)
    elif check == 'c':
        check_c(src, sys.argv[3:] or ['cc'])
    elif check == 'header':
        check_header(src)
    elif check == 'hello':
        check_hello(src)
    elif check == 'names':
        check_names(src, sys.argv[3:] or ['cc'])
    elif check == 'counts':
        check_counts(src)
    else:
        print(f'unknown check {check}', file=sys.stderr)
        return 2
    for p in problems:
        print('FAIL: ' + p)
    if not problems:
        print(f'{check}: ok')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
