#!/usr/bin/env python3
# shape.py: the shape of ckptd's product C code (git ls-files, less tests/ fuzz/ bench/ examples/):
# long files and functions, calls between files (circles, pairs), calls and includes that run back
# up the folder order, protocol types outside the RPC layer, and what the core libraries link.
# Run from anywhere in the repository:  scripts/shape.py [--long] [--json] [--check] [--link build]
# Needs Python 3 and universal-ctags (scripts/deps.sh installs the `universal-ctags` package).
"""Measure the shape of ckptd's C code; see the comment block above and --help."""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys

EXCLUDED = ("tests/", "fuzz/", "bench/", "examples/")
ORDER = ["ipc/base", "storage", "layout", "commit", "ipc",
         "agent/pipe", "agent/node", "agent/rpc", "agent/daemon", "client"]
FILE_LIMIT, FN_WARN, FN_LIMIT = 800, 60, 80
LINK_TESTS = {"ckpt_storage": "test_manifest", "ckpt_layout": "test_assign",
              "ckpt_commit": "test_commit"}
PROTO_RE = re.compile(r"\b(?:Ckpt__V1__|CKPT__V1__)\w*|\bProtobufCMessage\w*")
# Comments, string literals and character literals, in one pass (C has no nesting).
STRIP_RE = re.compile(r'/\*.*?\*/|//(?:\\\n|[^\n])*|"(?:\\.|\\\n|[^"\\\n])*"|'
                      r"'(?:\\.|[^'\\\n])*'", re.S)
CALL_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def product_files(root):
    """Tracked .c/.h files outside tests/, fuzz/, bench/, examples/ that exist now, sorted."""
    out = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h"], check=True,
                         capture_output=True, text=True).stdout.split()
    return sorted(p for p in out if not p.startswith(EXCLUDED)
                  and os.path.isfile(os.path.join(root, p)))


def ctags_functions(root, files):
    """Function definitions from ctags: list of (name, file, start, end, is_static)."""
    if shutil.which("ctags") is None:
        sys.exit("shape.py: `ctags` not found; install universal-ctags (scripts/deps.sh does)")
    cmd = ["ctags", "-x", "--languages=C", "--langmap=C:+.h", "--c-kinds=f",
           "--fields=+neZ", "--fields-C=+{properties}",
           "--_xformat=%N %F %n %e %{C.properties}", "-L", "-"]
    res = subprocess.run(cmd, cwd=root, input="\n".join(files) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("shape.py: ctags failed (universal-ctags needed):\n" + res.stderr)
    fns = []
    for line in res.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) < 4 or not parts[3].isdigit():
            continue
        props = parts[4] if len(parts) > 4 else ""
        fns.append((parts[0], parts[1], int(parts[2]), int(parts[3]),
                    "static" in props.split(",")))
    return sorted(fns, key=lambda f: (f[1], f[2], f[0]))


def strip_code(text):
    """Blank out comments and string/char literals, keeping line breaks."""
    return STRIP_RE.sub(lambda m: "\n" * m.group(0).count("\n") or " ", text)


def folder_of(path, order):
    """The longest folder of `order` that holds `path`, or None."""
    best = None
    for f in order:
        if path.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


def shape_files(texts, fns):
    """Section 1: files over the limit, functions over 60 and 80 lines, lines per folder."""
    lines = {p: t.count("\n") + (0 if t.endswith("\n") or not t else 1)
             for p, t in texts.items()}
    folders = collections.defaultdict(lambda: [0, 0])
    for p, n in lines.items():
        folders[os.path.dirname(p) or "."][0] += 1
        folders[os.path.dirname(p) or "."][1] += n
    long_fns = sorted(({"name": n, "file": f, "start": s, "lines": e - s + 1}
                       for n, f, s, e, _ in fns if e - s + 1 > FN_WARN),
                      key=lambda d: (-d["lines"], d["file"], d["name"]))
    return {"files": len(lines), "lines": sum(lines.values()),
            "folders": {k: {"files": v[0], "lines": v[1]} for k, v in sorted(folders.items())},
            "files_over_800": sorted(([p, n] for p, n in lines.items() if n > FILE_LIMIT),
                                     key=lambda x: (-x[1], x[0])),
            "functions": len(fns),
            "functions_over_60": len(long_fns),
            "functions_over_80": sum(1 for d in long_fns if d["lines"] > FN_LIMIT),
            "long_functions": long_fns}


def file_calls(code, fns):
    """Section 2's raw data: edges {(caller, callee_file): sorted fns} and ambiguous names."""
    homes = collections.defaultdict(set)   # non-static name -> .c files defining it
    local = collections.defaultdict(set)   # .c file -> every function it defines
    for n, f, _, _, static in fns:
        if f.endswith(".c"):
            local[f].add(n)
            if not static:
                homes[n].add(f)
    ambiguous = {n: sorted(fs) for n, fs in homes.items() if len(fs) > 1}
    target = {n: next(iter(fs)) for n, fs in homes.items() if len(fs) == 1}
    edges = collections.defaultdict(set)
    for path, text in code.items():
        if not path.endswith(".c"):
            continue
        for name in set(CALL_RE.findall(text)):
            home = target.get(name)
            if home and home != path and name not in local[path]:
                edges[(path, home)].add(name)
    return {k: sorted(v) for k, v in edges.items()}, dict(sorted(ambiguous.items()))


def strong_components(nodes, edges):
    """Tarjan's strongly connected components, each sorted, the list sorted."""
    succ = collections.defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(1000, 4 * len(nodes) + 100))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
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
            comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(comps)


def shape_calls(code, fns):
    """Section 2: circles of more than two files, and pairs of files calling each other."""
    edges, ambiguous = file_calls(code, fns)
    nodes = {p for p in code if p.endswith(".c")}
    circles = []
    for comp in strong_components(nodes, edges):
        if len(comp) > 2:
            inside = set(comp)
            circles.append({"files": comp, "edges": [
                [a, b, fs[0]] for (a, b), fs in sorted(edges.items())
                if a in inside and b in inside]})
    in_circle = {f for c in circles for f in c["files"]}
    pairs = [{"files": [a, b], "calls": [edges[(a, b)][0], edges[(b, a)][0]],
              "inside_circle": a in in_circle}
             for (a, b) in sorted(edges) if a < b and (b, a) in edges]
    return edges, {"edges": len(edges), "ambiguous": ambiguous, "circles": circles,
                   "pairs": pairs}


def resolve_include(name, src, tree, by_base):
    """The tree path an #include "name" in `src` means, or None (system, generated, unclear)."""
    if "/" in name:
        for cand in (os.path.normpath(os.path.join(os.path.dirname(src), name)), name):
            if cand in tree:
                return cand
        return None
    homes = by_base.get(name, [])
    return homes[0] if len(homes) == 1 else None


def shape_order(texts, edges, order):
    """Section 3: calls and includes from a lower folder into a higher one."""
    rank = {f: i for i, f in enumerate(order)}
    up = lambda a, b: (folder_of(a, order) is not None and folder_of(b, order) is not None
                       and rank[folder_of(a, order)] < rank[folder_of(b, order)])
    calls = [[a, b, fn] for (a, b), fs in sorted(edges.items()) if up(a, b) for fn in fs]
    tree = set(texts)
    by_base = collections.defaultdict(list)
    for p in sorted(tree):
        if p.endswith(".h"):
            by_base[os.path.basename(p)].append(p)
    includes, unresolved = [], set()
    for path, text in sorted(texts.items()):
        for name in INCLUDE_RE.findall(text):
            hit = resolve_include(name, path, tree, by_base)
            if hit is None:
                unresolved.add(name)
            elif up(path, hit):
                includes.append([path, hit])
    unplaced = sorted(p for p in texts if folder_of(p, order) is None)
    return {"order": order, "calls_up": calls, "includes_up": sorted(includes),
            "unresolved_includes": sorted(unresolved), "outside_order": unplaced}


def is_rpc_layer(path):
    """Files allowed to speak the protocol types: ipc/, agent/rpc/, client's rpc files."""
    return (path.startswith(("ipc/", "agent/rpc/")) or
            (path.startswith("client/") and "rpc" in os.path.basename(path)))


def shape_proto(code):
    """Section 4: protocol type tokens per file (in code, not comments), and outside the layer."""
    per = {p: len(PROTO_RE.findall(t)) for p, t in sorted(code.items())}
    per = {p: n for p, n in per.items() if n}
    outside = {p: n for p, n in per.items() if not is_rpc_layer(p)}
    return {"per_file": per, "outside_rpc": outside, "outside_total": sum(outside.values())}


def shape_link(build):
    """Section 5: each core library's link line (from a unit test linking only it)."""
    out = {}
    for lib, test in LINK_TESTS.items():
        path = os.path.join(build, "tests", "CMakeFiles", test + ".dir", "link.txt")
        if not os.path.isfile(path):
            out[lib] = {"test": test, "error": "no " + path}
            continue
        libs = []
        for tok in open(path).read().split():
            base = os.path.basename(tok)
            m = re.match(r"lib(.+?)\.(?:a|so)(?:\.[\d.]+)?$", base)
            name = m.group(1) if m else tok[2:] if tok.startswith("-l") else None
            if name and name not in libs:
                libs.append(name)
        out[lib] = {"test": test, "libs": libs,
                    "grpc": any("grpc" in x for x in libs),
                    "protobuf_c": any("protobuf" in x for x in libs)}
    return out


def failures(r):
    """What --check refuses, one line each."""
    bad = ["file over %d lines: %s (%d)" % (FILE_LIMIT, p, n) for p, n in r["files"]["files_over_800"]]
    bad += ["function over %d lines: %s:%d %s (%d)" % (FN_LIMIT, d["file"], d["start"], d["name"],
                                                      d["lines"])
            for d in r["files"]["long_functions"] if d["lines"] > FN_LIMIT]
    bad += ["circle: " + " ".join(c["files"]) for c in r["calls"]["circles"]]
    # An owner and its child call each other one way only: a pair is a circle too.
    bad += ["pair calling each other: " + " ".join(c["files"]) for c in r["calls"]["pairs"]]
    bad += ["call runs back up: %s -> %s %s" % tuple(c) for c in r["order"]["calls_up"]]
    # Includes back up are reported, not refused: the data path (agent/pipe/stream*.c)
    # reads the fields of the save it moves, declared by the node (agent/node/save.h).
    return bad


def print_summary(r, long_list):
    """The human summary, one section per measure."""
    f, c, o, p = r["files"], r["calls"], r["order"], r["proto"]
    print("1. Files and folders: %d files, %d lines, %d functions" % (f["files"], f["lines"], f["functions"]))
    for k, v in f["folders"].items():
        print("   %-14s %3d files %6d lines" % (k + "/", v["files"], v["lines"]))
    print("   files over %d lines: %d" % (FILE_LIMIT, len(f["files_over_800"])))
    for path, n in f["files_over_800"]:
        print("     %s %d" % (path, n))
    print("   functions over %d lines: %d, over %d: %d" % (FN_WARN, f["functions_over_60"],
                                                          FN_LIMIT, f["functions_over_80"]))
    if long_list:
        for d in f["long_functions"]:
            print("     %s:%d %s %d" % (d["file"], d["start"], d["name"], d["lines"]))
    print("2. Calls between files: %d file-to-file edges; %d names ambiguous (skipped)"
          % (c["edges"], len(c["ambiguous"])))
    for n, fs in c["ambiguous"].items():
        print("     %s: %s" % (n, " ".join(fs)))
    print("   circles of more than two files: %d" % len(c["circles"]))
    for circ in c["circles"]:
        print("     circle of %d: %s" % (len(circ["files"]), " ".join(circ["files"])))
        for a, b, fn in circ["edges"]:
            print("       %s -> %s (%s)" % (a, b, fn))
    print("   pairs that call each other: %d" % len(c["pairs"]))
    for pr in c["pairs"]:
        a, b = pr["files"]
        print("     %s -> %s (%s); %s -> %s (%s)%s" % (a, b, pr["calls"][0], b, a, pr["calls"][1],
                                                      "  [inside a circle]" if pr["inside_circle"] else ""))
    print("3. Folder order (lowest first): " + " < ".join(o["order"]))
    print("   calls running back up: %d" % len(o["calls_up"]))
    for a, b, fn in o["calls_up"]:
        print("     %s -> %s %s" % (a, b, fn))
    print("   includes running back up: %d" % len(o["includes_up"]))
    for a, b in o["includes_up"]:
        print("     %s -> %s" % (a, b))
    if o["outside_order"]:
        print("   files in no folder of the order: " + " ".join(o["outside_order"]))
    print("   includes not resolved in the tree (system, generated, or no unique header): "
          + (" ".join(o["unresolved_includes"]) or "none"))
    print("4. Protocol types (Ckpt__V1__*, CKPT__V1__*, ProtobufCMessage*, in code): %d outside the RPC layer"
          % p["outside_total"])
    for path, n in p["per_file"].items():
        print("     %-34s %4d%s" % (path, n, "" if is_rpc_layer(path) else "  (outside)"))
    if "link" in r:
        print("5. Link lines (from the unit test that links only the library):")
        for lib, d in r["link"].items():
            if "error" in d:
                print("     %s: %s" % (lib, d["error"]))
            else:
                print("     %s (%s): %s; grpc: %s, protobuf-c: %s" % (
                    lib, d["test"], " ".join(d["libs"]), "yes" if d["grpc"] else "no",
                    "yes" if d["protobuf_c"] else "no"))


def main():
    """Parse options, measure, print, and with --check exit 1 on anything over the bounds."""
    ap = argparse.ArgumentParser(description=__doc__, epilog=(
        "Needs universal-ctags on PATH: scripts/deps.sh must install the `universal-ctags` package."))
    ap.add_argument("--root", help="repository root (default: the git top of this script)")
    ap.add_argument("--long", action="store_true", help="list every function over 60 lines")
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 on a circle of files (two calling each other included), a "
                         "call running back up, a file over 800 lines or a function over 80 lines")
    ap.add_argument("--order", help="folder order, lowest first, comma-separated (default: %s)"
                    % ",".join(ORDER))
    ap.add_argument("--link", metavar="BUILD_DIR", help="also read the core libraries' link lines")
    a = ap.parse_args()
    root = a.root or subprocess.run(
        ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--show-toplevel"],
        check=True, capture_output=True, text=True).stdout.strip()
    order = [x.strip().strip("/") for x in a.order.split(",")] if a.order else ORDER
    files = product_files(root)
    texts = {}
    for p in files:
        with open(os.path.join(root, p), encoding="utf-8", errors="replace") as fh:
            texts[p] = fh.read()
    code = {p: strip_code(t) for p, t in texts.items()}
    fns = ctags_functions(root, files)
    edges, calls = shape_calls(code, fns)
    r = {"root": root, "files": shape_files(texts, fns), "calls": calls,
         "order": shape_order(texts, edges, order), "proto": shape_proto(code)}
    r["calls"]["all_edges"] = [[x, y, fs] for (x, y), fs in sorted(edges.items())]
    if a.link:
        r["link"] = shape_link(os.path.join(root, a.link) if not os.path.isabs(a.link) else a.link)
    bad = failures(r)
    r["check_failures"] = bad
    if a.json:
        json.dump(r, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        print_summary(r, a.long)
    if a.check:
        print("check: %s" % ("ok" if not bad else "%d failing" % len(bad)),
              file=sys.stderr if a.json else sys.stdout)
        for line in bad:
            print("  " + line, file=sys.stderr if a.json else sys.stdout)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
