#!/usr/bin/env python3
"""Parse what tools/trace_draw.c wrote and print a summary the C tests
assert on (tests/trace/draw/test_trace_draw.c, tests/examples/test_gpt_trace.c).

  check_draw.py svg FILE     the SVG as XML: one <g class="rank ..."> per
                             world rank (data-rank 0..W-1, each once); the
                             marked rows (culprits, stragglers), a culprit's
                             missing or differing operation (its box must
                             cover the peers' rectangles of that operation),
                             the failure line's label
  check_draw.py chrome FILE  the Chrome trace as JSON: events well formed,
                             complete events nested per (pid, tid)

Prints key=value lines; exits 1 (with the reason) when the file does not
parse or breaks a rule above."""
import json
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def classes(el):
    return (el.get("class") or "").split()


def svg(path):
    root = ET.parse(path).getroot()
    if root.tag != NS + "svg":
        fail("root is %s, not svg" % root.tag)
    rows, nodump, ops, bad, groups, op_groups = [], [], 0, 0, [], set()
    culprits, slow, evidence, differs, spans = [], [], [], [], {}
    for g in root.iter(NS + "g"):
        c = classes(g)
        if "rank" in c:
            r = int(g.get("data-rank"))
            last = int(g.get("data-last", r))  # a collapsed run of ranks without a dump
            if g.get("id") != "rank-%d" % r:
                fail("row %d has id %s" % (r, g.get("id")))
            rows.extend(range(r, last + 1))
            texts = [t.text or "" for t in g.iter(NS + "text")]
            label = "rank %d" % r if last == r else "ranks %d to %d" % (r, last)
            if label not in texts:
                fail("row %d is not labelled" % r)
            if last != r and "nodump" not in c:
                fail("rows %d to %d collapsed, but not without a dump" % (r, last))
            if "nodump" in c:
                if "no dump" not in texts:
                    fail("row %d without a dump does not say so" % r)
                nodump.extend(range(r, last + 1))
            for rect in g.iter(NS + "rect"):
                rc = classes(rect)
                for a in ("x", "width"):
                    if float(rect.get(a)) < 0:
                        fail("row %d: negative %s" % (r, a))
                if "culprit-band" in rc:
                    culprits.append(r)
                if "straggler-band" in rc:
                    slow.append(r)
                if "differs" in rc:
                    differs.append("%d:%.2f" % (r, float(rect.get("width"))))
                title = rect.find(NS + "title")
                if "op" in rc and title is not None:  # where each operation is drawn
                    x0 = float(rect.get("x"))
                    key = (r, title.text.split("\n")[0].split(": ", 1)[1])
                    spans[key] = (x0, x0 + float(rect.get("width")))
                if "op" in rc:
                    ops += 1
                    bad += "bad" in rc
                    title = rect.find(NS + "title")
                    if title is None or not title.text.startswith("rank %d: " % r):
                        fail("row %d: an op without its tooltip" % r)
                    # "rank R: KIND #GSEQ on NAME[INDEX]"
                    on = title.text.split("\n")[0].split(" on ", 1)[1]
                    op_groups.add(on.rsplit("[", 1)[0])
        if "evidence" in c:
            row = None
            for rg in root.iter(NS + "g"):
                if "rank" in classes(rg) and g in list(rg.iter(NS + "g")):
                    row = int(rg.get("data-rank"))
            if row is None:
                fail("a culprit's operation outside a row")
            box = g.find(NS + "rect")
            label = g.find(NS + "text").text
            evidence.append((row, "missing" if "missing" in c else "differs", label,
                             g.get("data-op"), float(box.get("x")),
                             float(box.get("x")) + float(box.get("width"))))
        if "legend" in c:
            groups = [t.text for t in g.iter(NS + "text")][:-2]
    if sorted(rows) != list(range(len(rows))):
        fail("rows %s are not 0..W-1 once each" % rows)
    failure = sum(1 for g in root.iter(NS + "g") if "failure" in classes(g))
    labels = [t.text for g in root.iter(NS + "g") if "failure" in classes(g)
              for t in g.iter(NS + "text")]
    # A culprit's box covers the peers' rectangles of the operation (other
    # rows), from their issue to their end.
    ev_out = []
    for row, kind, label, op, x0, x1 in evidence:
        peers = [v for (rr, lab), v in spans.items() if rr != row and lab == op]
        covers = bool(peers) and all(x0 <= a + 0.01 and x1 >= b - 0.01 for a, b in peers)
        ev_out.append("%d:%s:%s:%s" % (row, kind, label, "covers" if covers else
                                       "nopeers" if not peers else "off"))
    print("rows=%d" % len(rows))
    print("nodump=%s" % ",".join(map(str, nodump)))
    print("ops=%d" % ops)
    print("bad=%d" % bad)
    print("failure=%d" % failure)
    print("groups=%s" % ",".join(groups))
    print("op_groups=%s" % ",".join(sorted(op_groups)))
    print("culprits=%s" % ",".join(map(str, culprits)))
    print("stragglers=%s" % ",".join(map(str, slow)))
    print("evidence=%s" % ";".join(ev_out))
    print("differs=%s" % ",".join(differs))
    print("failure_label=%s" % (labels[0] if labels else ""))


def chrome(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    pids, names, spans, cats, instants, xs = set(), {}, {}, set(), 0, 0
    for e in ev:
        ph = e["ph"]
        if not isinstance(e["pid"], int):
            fail("pid %r" % e["pid"])
        pids.add(e["pid"])
        if ph == "M":
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
        elif ph == "X":
            xs += 1
            if e["ts"] < 0 or e["dur"] < 0:
                fail("negative ts or dur: %r" % e)
            if not isinstance(e["tid"], int):
                fail("tid %r" % e["tid"])
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["dur"]))
            if e["cat"] != "wait":
                cats.add(e["cat"])
                for k in ("kind", "group", "gseq", "count", "bucket", "status"):
                    if k not in e["args"]:
                        fail("event without args.%s" % k)
        elif ph == "i":
            instants += 1
        else:
            fail("unexpected phase %r" % ph)
    for key, sp in spans.items():
        sp.sort()
        for (a, da), (b, db) in zip(sp, sp[1:]):
            if b < a + da - 1e-3 and b + db > a + da + 1e-3:
                fail("slices overlap without nesting on %s" % (key,))
    for p in pids:
        nm = names.get(p, "")
        if not (nm.startswith("rank %d" % p) or nm.startswith("ranks %d to " % p)):
            fail("pid %d is named %r" % (p, names.get(p)))
    print("pids=%s" % ",".join(map(str, sorted(pids))))
    print("complete=%d" % xs)
    print("instants=%d" % instants)
    print("cats=%s" % ",".join(sorted(cats)))


if __name__ == "__main__":
    try:
        {"svg": svg, "chrome": chrome}[sys.argv[1]](sys.argv[2])
    except (ET.ParseError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        fail("%s: %s: %s" % (sys.argv[2], type(e).__name__, e))
