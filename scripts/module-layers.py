#!/usr/bin/env python3
"""Checks the layers of the nginx module (module/ngx-combined-upstreams/src).

Prints, per file, the `unsafe {` blocks and `extern "C" fn`s outside comments, and the
`crate::X` edges between the crate's top-level modules (lib, conf, ffi, the features), then
the import cycles among them (strongly connected components). Exits 1 when there is a cycle,
when `ffi` uses any other module of the crate, when a file outside `ALLOWED` has an `unsafe {`
block, or when a file outside `ffi/` defines an `extern "C" fn`.

Usage: python3 scripts/module-layers.py [SRC_DIR]
"""
import pathlib
import re
import sys

SRC = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                   pathlib.Path(__file__).resolve().parent.parent
                   / "module/ngx-combined-upstreams/src")
# Files that may hold `unsafe {}`: the FFI layer only.
ALLOWED = ("ffi/",)

def top(rel: str) -> str:
    parts = rel.split("/")
    return parts[0][:-3] if len(parts) == 1 else parts[0]

def code_lines(text: str):
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//"):
            continue
        yield line

edges = {}
bad = []
print(f"{'unsafe{':>8} {'extern C':>8}  file")
for path in sorted(SRC.rglob("*.rs")):
    rel = path.relative_to(SRC).as_posix()
    me = top(rel)
    lines = list(code_lines(path.read_text()))
    n_unsafe = sum(len(re.findall(r"\bunsafe\s*\{", l)) for l in lines)
    n_extern = sum(len(re.findall(r'extern\s+"C"\s+fn\s+\w', l)) for l in lines)
    print(f"{n_unsafe:>8} {n_extern:>8}  {rel}")
    if n_unsafe and not rel.startswith(ALLOWED):
        bad.append(f"{rel}: unsafe {{}} outside {ALLOWED}")
    if n_extern and not rel.startswith("ffi/"):
        bad.append(f"{rel}: extern \"C\" fn outside ffi/")
    body = "\n".join(lines)
    deps = set(re.findall(r"\bcrate::(\w+)", body))
    # `use crate::{a, b::c}` groups
    for group in re.findall(r"\bcrate::\{([^}]*)\}", body):
        deps |= {g.strip().split("::")[0] for g in group.split(",") if g.strip()}
    if me == "lib":
        # lib.rs names its modules by their paths (`conf::X`) after `mod conf;`
        mods = set(re.findall(r"^\s*mod (\w+);", body, re.M))
        deps |= {m for m in mods if re.search(rf"\b{m}::", body)}
    deps.discard(me)
    deps.discard("")
    edges.setdefault(me, set()).update(deps)

print("\nedges (module -> modules it uses):")
for m in sorted(edges):
    print(f"  {m} -> {', '.join(sorted(edges[m])) or '-'}")

# Tarjan's strongly connected components
index, low, stack, on, sccs = {}, {}, [], set(), []
def strong(v, counter=[0]):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        sccs.append(comp)
for v in list(edges):
    if v not in index:
        strong(v)
cycles = [sorted(c) for c in sccs if len(c) > 1]
print("\nimport cycles:", cycles or "none")
ffi_deps = edges.get("ffi", set())
if ffi_deps:
    bad.append(f"ffi uses {sorted(ffi_deps)}")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if cycles or bad else 0)
