#!/usr/bin/env python3
"""Zero-reload server changes under keep-alive load, through the daemon: a thin wrapper of the Rust
bench module/t/bench/bench_live/ (its main.rs doc says what it measures and prints).

    cargo build --release -p tributary -p tributary-plugin-static -p ngx-combined-upstreams
    python3 scripts/bench-live.py [--seconds 60] [--segment-seconds 10] [--interval-ms 100]
                                  [--modes none,live,reload[,weights]] [--no-probe] [--json FILE]
                                  [--think-ms N] [--connections 32]

runs `cargo bench -p combined-upstreams-tests --bench bench_live -- OPTIONS` from the workspace root.
Environment: COMBINED_UPSTREAMS_MODULE, NGINX_BIN, BENCH_PROFILE, TRIBUTARY_BIN, CARGO_TARGET_DIR.
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# cargo runs the bench in module/t: paths given here become absolute.
for var in ("COMBINED_UPSTREAMS_MODULE", "NGINX_BIN", "TRIBUTARY_BIN", "CARGO_TARGET_DIR"):
    if os.environ.get(var):
        os.environ[var] = os.path.abspath(os.environ[var])
args = sys.argv[1:]
for i, a in enumerate(args):
    if a.startswith("--json="):
        args[i] = "--json=" + os.path.abspath(a[len("--json="):])
    elif a == "--json" and i + 1 < len(args):
        args[i + 1] = os.path.abspath(args[i + 1])
os.chdir(ROOT)
os.execvp("cargo", ["cargo", "bench", "-q", "-p", "combined-upstreams-tests", "--bench", "bench_live", "--", *args])
