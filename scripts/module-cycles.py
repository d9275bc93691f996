#!/usr/bin/env python3
"""Import cycles between the modules of a Rust crate.

Usage: scripts/module-cycles.py crates/daemon/src [DEPTH]

Reads every `crate::`, `super::` and `self::` path in the code (comments left out, `use` groups
expanded) of each file under the source folder, keeps the module part of the path (the folders and
files that exist), lifts both ends to DEPTH segments (1: top-level modules such as `http`, `engine`;
2: `http::api`, `engine::fleet`...) and leaves out edges between a module and its own ancestor (a
parent declares its children). Prints the edges and every cycle (strongly connected component of
more than one module); exits 1 when there is one. A name that is both a function and a module of the
same parent (`ui::form`) counts as the module: that can only add edges."""
import os, re, sys

src = sys.argv[1]
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 1

def modpath(rel):
    parts = rel[:-3].split('/')
    if parts[-1] in ('mod', 'lib', 'main'):
        parts = parts[:-1]
    return parts

def expand(prefix, body):
    # expand a use-tree `a::{b, c::{d}}` into paths
    out, depth_, cur, items = [], 0, '', []
    for ch in body:
        if ch == ',' and depth_ == 0:
            items.append(cur); cur = ''
            continue
        if ch == '{': depth_ += 1
        if ch == '}': depth_ -= 1
        cur += ch
    items.append(cur)
    for it in items:
        it = it.strip()
        if not it: continue
        m = re.match(r'^([\w:]*?)::\{(.*)\}$', it, re.S)
        if m:
            out += expand(prefix + m.group(1).split('::'), m.group(2))
        elif it.startswith('{') and it.endswith('}'):
            out += expand(prefix, it[1:-1])
        else:
            out.append(prefix + [s for s in it.split(' as ')[0].split('::') if s])
    return out

edges = set()
for root, _, files in os.walk(src):
    for f in files:
        if not f.endswith('.rs'): continue
        p = os.path.join(root, f)
        me = modpath(os.path.relpath(p, src))
        text = open(p).read()
        text = re.sub(r'//[^\n]*', '', text)
        paths = []
        for m in re.finditer(r'\b(crate|super|self)((?:::\w+)*)::\{', text):
            # brace group: find matching brace
            i = m.end() - 1; d = 0
            for j in range(i, len(text)):
                if text[j] == '{': d += 1
                elif text[j] == '}':
                    d -= 1
                    if d == 0: break
            base = [m.group(1)] + [s for s in m.group(2).split('::') if s]
            paths += expand(base, text[i+1:j])
        for m in re.finditer(r'\b(crate|super|self)((?:::\w+)+)', text):
            paths.append([m.group(1)] + [s for s in m.group(2).split('::') if s])
        for path in paths:
            if path[0] == 'crate':
                tgt = path[1:]
            else:
                cur = list(me)
                k = 0
                while k < len(path) and path[k] in ('super', 'self'):
                    if path[k] == 'super': cur = cur[:-1]
                    k += 1
                tgt = cur + path[k:]
            # keep module segments only (lower-case identifiers)
            mods = []
            for s in tgt:
                if s and s[0].islower() or s == '_':
                    mods.append(s)
                else:
                    break
            # the last lower-case segment may be a function: keep it only if it is a module
            while mods and not (os.path.exists(os.path.join(src, *mods) + '.rs') or os.path.isdir(os.path.join(src, *mods))):
                mods = mods[:-1]
            a, b = tuple(me[:depth]), tuple(mods[:depth])
            if not b or a == b: continue
            if a[:len(b)] == b or b[:len(a)] == a: continue  # ancestor / descendant
            edges.add((a, b))

nodes = sorted({n for e in edges for n in e})
adj = {n: sorted(b for a, b in edges if a == n) for n in nodes}
# Tarjan
index, low, stack, on, sccs, c = {}, {}, [], set(), [], [0]
def strong(v):
    index[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
    for w in adj[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in nodes:
    if v not in index: strong(v)
name = lambda n: '::'.join(n)
for n in nodes:
    if adj[n]:
        print(f"{name(n)} -> {', '.join(name(b) for b in adj[n])}")
print(f"cycles at depth {depth}: {len(sccs)}")
for s in sccs:
    print("  cycle:", ' <-> '.join(name(n) for n in s))
sys.exit(1 if sccs else 0)
