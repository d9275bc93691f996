#!/usr/bin/env python3
"""Issue 11 benchmark: zero-reload server changes under keep-alive load.

    cargo build -p tributary -p tributary-plugin-static
    cargo build --release -p ngx-combined-upstreams
    python3 scripts/bench-live.py [--seconds 60] [--interval-ms 100] [--modes none,live,reload]

For each mode, a fresh nginx (master + 2 workers, the combined-upstreams module loaded, its
upstreams API on a unix socket) with 4 backends and a front server proxying to the upstream `bench`
(keepalive 16), and a fresh `tributary serve` (static plugin) managing it with `--apply live` or
`--apply reload` (`none` runs live mode without changes: the baseline). `wrk` keeps 32 keep-alive
connections on the front server for the whole run while a driver saves the binding every
`--interval-ms` (alternating between backends 1+2 and 3+4) through the daemon's API, without waiting.
After each save a prober opens new connections to the front server until an answer comes from the
new set.

Reported per mode: requests/s, p99 and max latency, non-2xx and socket errors (wrk), worker processes
started (nginx's error log, "start worker process"), nginx RSS (master + every worker alive, summed;
peak over 100 ms samples), and the change latency: from the save sent to the first answer from the
new set (includes the plugin call and the daemon's batch window), plus the daemon's own decision to
confirmed time (its "batch applied" log, took_ms). Ratios against the `none` run of the same
invocation. Every process started is stopped at the end.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
SO = os.environ.get(
    "COMBINED_UPSTREAMS_MODULE",
    os.path.join(TARGET, "release/libngx_http_combined_upstreams_module.so"),
)
TRIBUTARY = os.path.join(TARGET, "debug/tributary")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path="/", timeout=2.0):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path, headers={"Connection": "close"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def api(port, token, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(d))
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def parse_wrk(text):
    def num_time(s):
        m = re.match(r"([\d.]+)(us|ms|s|m)", s)
        v, u = float(m.group(1)), m.group(2)
        return v * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[u]

    out = {"non2xx": 0, "socket_errors": 0}
    m = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", text)
    out["max_ms"] = num_time(m.group(3))
    m = re.search(r"\s99%\s+(\S+)", text)
    out["p99_ms"] = num_time(m.group(1))
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    out["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = int(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        out["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        out["socket_errors"] = sum(int(x) for x in m.groups())
    return out


def run_mode(mode, seconds, interval_ms, connections):
    tmp = tempfile.mkdtemp(prefix=f"tributary-bench-{mode}-")
    prefix = os.path.join(tmp, "nginx")
    for sub in ["conf/upstreams", "logs", "tmp"]:
        os.makedirs(os.path.join(prefix, sub))
    front = free_port()
    backs = [free_port() for _ in range(4)]
    sock = os.path.join(prefix, "logs/api.sock")
    user = "user root;\n" if os.geteuid() == 0 else ""
    backends = "\n".join(
        f'    server {{ listen 127.0.0.1:{p}; location / {{ return 200 "b{i + 1}"; }} }}'
        for i, p in enumerate(backs)
    )
    conf = f"""load_module {SO};
{user}daemon off;
master_process on;
worker_processes 2;
pid {prefix}/logs/nginx.pid;
error_log {prefix}/logs/error.log notice;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type text/plain;
    client_body_temp_path {prefix}/tmp/cb; proxy_temp_path {prefix}/tmp/p;
    fastcgi_temp_path {prefix}/tmp/f; uwsgi_temp_path {prefix}/tmp/u; scgi_temp_path {prefix}/tmp/s;
    include upstreams/*.conf;
    server {{ listen unix:{sock}; location /api/ {{ upstreams_api; }} }}
{backends}
    server {{
        listen 127.0.0.1:{front};
        location / {{ set $up bench; proxy_pass http://$up; proxy_http_version 1.1;
                      proxy_set_header Connection ""; }}
    }}
}}
"""
    conf_path = os.path.join(prefix, "conf/nginx.conf")
    with open(conf_path, "w") as f:
        f.write(conf)
    ngx = ["nginx", "-p", prefix, "-c", conf_path, "-e", "stderr"]
    procs = []
    try:
        nginx = subprocess.Popen(ngx, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(prefix, "logs/stderr.log"), "w"))
        procs.append(nginx)
        wait_for(lambda: os.path.exists(os.path.join(prefix, "logs/nginx.pid")), 10, "nginx")
        master = int(open(os.path.join(prefix, "logs/nginx.pid")).read())
        plugins = os.path.join(tmp, "plugins")
        os.makedirs(os.path.join(plugins, "static"))
        manifest = json.load(open(os.path.join(ROOT, "plugins/static/plugin.json")))
        manifest["executable"] = os.path.join(TARGET, "debug/tributary-plugin-static")
        json.dump(manifest, open(os.path.join(plugins, "static/plugin.json"), "w"))
        api_port = free_port()
        apply = "reload" if mode == "reload" else "live"
        dlog = open(os.path.join(tmp, "daemon.log"), "w")
        daemon = subprocess.Popen(
            [TRIBUTARY, "serve", "--listen", f"127.0.0.1:{api_port}",
             "--data-dir", os.path.join(tmp, "data"), "--plugins-dir", plugins,
             "--conf-dir", os.path.join(prefix, "conf"),
             "--test-cmd", " ".join(ngx + ["-t"]), "--reload-cmd", " ".join(ngx + ["-s", "reload"]),
             "--min-reload-gap-ms", "100", "--batch-quiet-ms", "5", "--batch-max-ms", "50",
             "--apply", apply, "--live-api", f"unix:{sock}:/api/"],
            stdout=subprocess.DEVNULL, stderr=dlog,
            env=dict(os.environ, RUST_LOG="info", NO_COLOR="1"))
        procs.append(daemon)
        wait_for(lambda: get(api_port, "/api/v1/health")[0] == 200, 30, "daemon")
        token = open(os.path.join(tmp, "data/token")).read().strip()
        # One backend per set, rotating: an answer from backend i+1 after change i was sent is
        # change i's (change i-4 with the same backend came 4 intervals earlier).
        sets = [(f"127.0.0.1:{backs[k]}", {f"b{k + 1}"}) for k in range(4)]

        def body(i):
            return {"plugin": "static", "provider": "static", "service": "bench",
                    "config": {"targets": sets[i % 4][0]}, "directives": ["keepalive 16;"]}

        st, v = api(api_port, token, "PUT", "/api/v1/bindings/bench?wait=true", body(0))
        assert st in (200, 201) and v["binding"]["last_outcome"]["status"] == "ok", v
        wait_for(lambda: get(front)[1] in sets[0][1], 10, "first set")
        time.sleep(1.0)
        log0 = open(os.path.join(prefix, "logs/error.log")).read()
        started_before = log0.count("start worker process")
        reloads_before = log0.count("(SIGHUP) received")
        took_before = len(re.findall(r"took_ms[=:]\s*(\d+)", open(os.path.join(tmp, "daemon.log")).read()))

        stop = threading.Event()
        rss_peak = [0]

        def sample_rss():
            while not stop.is_set():
                total = rss_kib(master) + sum(rss_kib(c) for c in children(master))
                rss_peak[0] = max(rss_peak[0], total)
                time.sleep(0.1)

        visible_ms, changes, put_errors, late = [], [0], [0], [0]

        def probe(t0, want):
            # New connections to the front server until an answer comes from the new set.
            while time.time() < t0 + 2 and not stop.is_set():
                try:
                    if get(front, timeout=1)[1] in want:
                        visible_ms.append((time.time() - t0) * 1000.0)
                        return
                except OSError:
                    pass
                time.sleep(0.002)
            late[0] += 1

        def drive():
            i = 1
            t_next = time.time()
            probes = []
            while not stop.is_set():
                t_next += interval_ms / 1000.0
                t0 = time.time()
                try:
                    st, _ = api(api_port, token, "PUT", "/api/v1/bindings/bench", body(i))
                    if st != 200:
                        put_errors[0] += 1
                except OSError:
                    put_errors[0] += 1
                changes[0] += 1
                p = threading.Thread(target=probe, args=(t0, sets[i % 4][1]))
                p.start()
                probes.append(p)
                i += 1
                pause = t_next - time.time()
                if pause > 0:
                    time.sleep(pause)
            for p in probes:
                p.join()

        sampler = threading.Thread(target=sample_rss)
        sampler.start()
        wrk = subprocess.Popen(
            ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency",
             f"http://127.0.0.1:{front}/"], stdout=subprocess.PIPE, text=True)
        driver = None
        if mode != "none":
            driver = threading.Thread(target=drive)
            driver.start()
        out, _ = wrk.communicate()
        stop.set()
        if driver:
            driver.join()
        sampler.join()
        time.sleep(0.5)
        log = open(os.path.join(prefix, "logs/error.log")).read()
        started = log.count("start worker process") - started_before
        reloads = log.count("(SIGHUP) received") - reloads_before
        dtext = open(os.path.join(tmp, "daemon.log")).read()
        took = [int(x) for x in re.findall(r"took_ms[=:]\s*(\d+)", dtext)][took_before:]
        push = [float(x) for x in re.findall(r"push_ms[=:]\s*([\d.]+)", dtext)]
        res = parse_wrk(out)
        res.update({
            "mode": mode, "changes_sent": changes[0], "put_errors": put_errors[0],
            "workers_started": started, "reloads": reloads, "rss_peak_kib": rss_peak[0],
            "visible_ms": visible_ms, "not_seen_within_2s": late[0],
            "daemon_took_ms": took, "push_ms": push, "wrk": out,
        })
        return res
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if p is not procs[0] else signal.SIGQUIT)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--modes", default="none,live,reload")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    for need in [SO, TRIBUTARY, os.path.join(TARGET, "debug/tributary-plugin-static")]:
        if not os.path.exists(need):
            sys.exit(f"bench-live: {need} is missing (see the build commands at the top of this script)")
    if not shutil.which("wrk") or not shutil.which("nginx"):
        sys.exit("bench-live: needs wrk and nginx (scripts/setup.sh)")
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}  cpus: {os.cpu_count()}")
    results = {}
    for mode in a.modes.split(","):
        print(f"== {mode}: {a.seconds} s of wrk -c{a.connections}"
              + ("" if mode == "none" else f", a change every {a.interval_ms} ms"), flush=True)
        results[mode] = run_mode(mode, a.seconds, a.interval_ms, a.connections)
    base = results.get("none")
    print()
    print("| mode | req/s | p99 ms | max ms | non-2xx | socket errors | changes sent | reloads "
          "| workers started | nginx RSS peak MiB | visible p50/p99/max ms (n) | daemon batch decision→confirmed p50/p99 ms | live PUT→read back p50/p99/max ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        vis = r["visible_ms"]
        took = r["daemon_took_ms"]
        print(f"| {mode} | {r['rps']:.0f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | {r['non2xx']} | "
              f"{r['socket_errors']} | {r['changes_sent']} | {r['reloads']} | {r['workers_started']} | "
              f"{r['rss_peak_kib'] / 1024:.1f} | "
              + (f"{pct(vis, .5):.1f}/{pct(vis, .99):.1f}/{max(vis):.1f} ({len(vis)} seen, {r['not_seen_within_2s']} not within 2 s)"
                 if vis else "-")
              + " | " + (f"{pct(took, .5)}/{pct(took, .99)}" if took else "-")
              + " | " + (f"{pct(r['push_ms'], .5):.1f}/{pct(r['push_ms'], .99):.1f}/{max(r['push_ms']):.1f}" if r['push_ms'] else "-") + " |")
    if base:
        for mode, r in results.items():
            if mode == "none":
                continue
            print(f"{mode} / none: req/s {r['rps'] / base['rps']:.3f}, p99 {r['p99_ms'] / base['p99_ms']:.3f}, "
                  f"max {r['max_ms'] / base['max_ms']:.3f}, RSS peak {r['rss_peak_kib'] / max(1, base['rss_peak_kib']):.3f}")
    with open("/proc/loadavg") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
