#!/usr/bin/env python3
"""Counts puzzletron's public items and lists every item reachable by more than one path.

Reads the rustdoc JSON that `cargo +nightly rustdoc --lib -- -Z unstable-options
--output-format json` writes (issue 31's check: one path per item). Usage:

    scripts/api-surface.py [--features F] [--list]

Prints `items N`, `modules M`, `two-path N` and, with --list, each public path.
Exits 1 when an item is reachable by two paths.
"""
import json, subprocess, sys, os, collections

args = sys.argv[1:]
features = []
if "--features" in args:
    features = ["--features", args[args.index("--features") + 1]]
root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
subprocess.run(["cargo", "+nightly", "rustdoc", "-q", "--lib", *features, "--",
                "-Z", "unstable-options", "--output-format", "json"], cwd=root_dir, check=True)
d = json.load(open(os.path.join(root_dir, "target/doc/puzzletron.json")))
index = d["index"]
paths = collections.defaultdict(set)   # item id -> public paths
modules = set()

def walk(mid, prefix, seen):
    if mid in seen:
        return
    seen = seen | {mid}
    m = index.get(str(mid))
    if m is None:
        return
    for cid in m["inner"]["module"]["items"]:
        it = index.get(str(cid))
        if it is None or it["visibility"] != "public":
            continue
        inner = it["inner"]
        if "use" in inner:
            u = inner["use"]
            tid = u["id"]
            if tid is None or str(tid) not in index:
                continue  # a re-export of another crate's item
            tgt = index[str(tid)]
            if u["is_glob"]:
                if "module" in tgt["inner"]:
                    walk(tid, prefix, seen)
                continue
            name = prefix + "::" + u["name"]
            if "module" in tgt["inner"]:
                modules.add(name)
                paths[tid].add(name)
                walk(tid, name, seen)
            else:
                paths[tid].add(name)
            continue
        if it.get("attrs") and any("doc(hidden)" in str(a) for a in it["attrs"]):
            continue
        name = prefix + "::" + (it["name"] or "?")
        if "module" in inner:
            modules.add(name)
            paths[cid].add(name)
            walk(cid, name, seen)
        elif "impl" not in inner:
            paths[cid].add(name)

walk(d["root"], "puzzletron", frozenset())
items = {k: v for k, v in paths.items() if "module" not in index[str(k)]["inner"]}
dups = {k: sorted(v) for k, v in items.items() if len(v) > 1}
names = collections.defaultdict(set)
for k, v in items.items():
    for p in v:
        names[p.rsplit("::", 1)[1]].add(k)
same_name = {n: ids for n, ids in names.items() if len(ids) > 1}
print(f"items {len(items)}")
print(f"modules {len(modules)}")
print(f"two-path {len(dups)}")
for k, v in sorted(dups.items(), key=lambda kv: kv[1][0]):
    print("  " + "  ==  ".join(v))
print(f"names-for-two-types {len(same_name)}")
for n, ids in sorted(same_name.items()):
    print("  " + n + ": " + ", ".join(sorted(p for i in ids for p in items[i])))
if "--list" in args:
    for p in sorted(p for v in items.values() for p in v):
        print(p)
sys.exit(1 if dups else 0)
