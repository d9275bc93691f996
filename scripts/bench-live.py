#!/usr/bin/env python3
"""Issue 11 benchmark: zero-reload server changes under keep-alive load.

    cargo build --release -p tributary -p tributary-plugin-static -p ngx-combined-upstreams
    python3 scripts/bench-live.py [--seconds 60] [--segment-seconds 10] [--interval-ms 100]
                                  [--modes none,live,reload[,weights]] [--no-probe] [--json FILE]
                                  [--think-ms N]

One stack per mode, all started first and kept up for the whole run: a fresh nginx (master + 2
workers, the combined-upstreams module loaded, its upstreams API on a unix socket) with 4 backends
and a front server proxying to the upstream `bench` (keepalive 16), and a fresh `tributary serve`
(static plugin) managing it with `--apply live` or `--apply reload` (`none`: live mode, no changes:
the baseline; `weights`, not run by default: live mode, each change only flips the one server's
weight between 1 and 2 — all the work of a live change, no traffic moved, no prober; `twin`, not
run by default: a second `none`, to see how far two identical stacks differ on the machine). The modes then take turns in segments of `--segment-seconds` (order rotated every
round, so each mode runs as often in each position) until each had `--seconds`: drift of a shared
machine hits every mode alike. In a segment `wrk -c32` keeps keep-alive connections on the mode's
front server (each sending its next request as soon as the answer came: the cores are saturated; with
`--think-ms N` each connection waits N ms after an answer — a load below saturation, what the tail of a
server with headroom looks like) while (live, reload) a driver saves the binding every `--interval-ms` (rotating over
the 4 backends) through the daemon's API, without waiting; after each save a prober opens new
connections to the front server until an answer comes from the new set.

Reported per mode: requests/s, p50/p99/max latency over all its segments (wrk's latency histograms
merged exactly) and the spread of the segments' p99; non-2xx and socket errors; reloads and worker
processes started (nginx's error log); nginx RSS peak (master + workers, 100 ms samples); CPU
seconds of nginx (master, workers, reaped workers), of the daemon and of the commands it ran
(`nginx -t`, reload), per segment. Change latency, with the definitions of docs/live-api.md:
- decided→visible (daemon): from the daemon's decision (the new bytes rendered from a validated
  answer, handed to the apply task) to the `PUT` answered by nginx (every worker selects from the
  new set from then on); decided→confirmed adds the read-back `GET`; and where the time went:
  waited (queue + batch window), write (journal + file + fsyncs), list_wait (the API's list, asked
  as the batch starts, still awaited), put, readback; test (`nginx -t`, after the push: not part of it;
  0 when `--live-test first` skipped it). From the daemon's "applied live" log lines.
- decided→seen (outside): from the decision (its wall-clock time, logged) to the first answer from
  the new set seen by the prober (a new connection every ~2 ms): what a client sees.
- save→seen: from the save request sent to the daemon's API to that first answer (adds the API
  call and the plugin call).
Ratios against `none` of the same run, with the spread of the per-round p99 ratios. Every process
started is stopped at the end.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
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
# The daemon and the static plugin as an operator runs them: release builds. BENCH_PROFILE=debug takes
# the debug builds instead; TRIBUTARY_BIN: another build of the daemon.
PROFILE = os.environ.get("BENCH_PROFILE", "release")
TRIBUTARY = os.environ.get("TRIBUTARY_BIN", os.path.join(TARGET, PROFILE, "tributary"))
STATIC_PLUGIN = os.path.join(TARGET, PROFILE, "tributary-plugin-static")
CLK = os.sysconf("SC_CLK_TCK")

# wrk's latency histogram (µs value, count per distinct value), written at the end of a run.
WRK_LUA = """
done = function(summary, latency, requests)
  local f = io.open(os.getenv("WRK_HIST"), "w")
  local e = summary.errors
  f:write(string.format("requests %d\\nerrors %d %d %d %d %d\\n", summary.requests,
          e.connect, e.read, e.write, e.status, e.timeout))
  for i = 1, #latency do
    local v, n = latency(i)
    f:write(string.format("%d %d\\n", v, n))
  end
  f:close()
end
"""


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


def stat_fields(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if int(stat_fields(d)[1]) == pid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_s(pid, reaped=True):
    """utime + stime (+ the reaped children's cutime + cstime) of a process, in seconds."""
    try:
        f = stat_fields(pid)
    except OSError:
        return 0.0
    # fields from "state": utime is the 14th stat field, i.e. index 11 here.
    t = int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if reaped else 0)
    return t / CLK


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


def read_hist(path):
    out = {"requests": 0, "errors": [0] * 5, "hist": {}}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "requests":
                out["requests"] = int(parts[1])
            elif parts[0] == "errors":
                out["errors"] = [int(x) for x in parts[1:]]
            else:
                out["hist"][int(parts[0])] = out["hist"].get(int(parts[0]), 0) + int(parts[1])
    return out


def hist_pct(hist, q):
    """The value (µs) at quantile q of a {value: count} histogram, as wrk computes it."""
    total = sum(hist.values())
    if total == 0:
        return float("nan")
    want, acc = q * total, 0
    for v in sorted(hist):
        acc += hist[v]
        if acc >= want:
            return v
    return max(hist)


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


# Modes without changes: `none`, the baseline, and `twin`, a second stack like it (an A/A
# comparison: the ratios twin / none show how much two identical stacks differ on this machine).
IDLE = ("none", "twin")


class Stack:
    """nginx + tributary for one mode."""

    def __init__(self, mode):
        self.mode = mode
        self.tmp = tempfile.mkdtemp(prefix=f"tributary-bench-{mode}-")
        self.procs = []
        prefix = self.prefix = os.path.join(self.tmp, "nginx")
        for sub in ["conf/upstreams", "logs", "tmp"]:
            os.makedirs(os.path.join(prefix, sub))
        self.front = free_port()
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
    server {{ listen unix:{sock}; location /api/ {{ upstreams_api write=on; }} }}
{backends}
    server {{
        listen 127.0.0.1:{self.front};
        location / {{ set $up bench; proxy_pass http://$up; proxy_http_version 1.1;
                      proxy_set_header Connection ""; }}
    }}
}}
"""
        conf_path = os.path.join(prefix, "conf/nginx.conf")
        with open(conf_path, "w") as f:
            f.write(conf)
        ngx = ["nginx", "-p", prefix, "-c", conf_path, "-e", "stderr"]
        nginx = subprocess.Popen(ngx, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(prefix, "logs/stderr.log"), "w"))
        self.procs.append(nginx)
        wait_for(lambda: os.path.exists(os.path.join(prefix, "logs/nginx.pid")), 10, "nginx")
        self.master = int(open(os.path.join(prefix, "logs/nginx.pid")).read())
        plugins = os.path.join(self.tmp, "plugins")
        os.makedirs(os.path.join(plugins, "static"))
        manifest = json.load(open(os.path.join(ROOT, "plugins/static/plugin.json")))
        manifest["executable"] = STATIC_PLUGIN
        json.dump(manifest, open(os.path.join(plugins, "static/plugin.json"), "w"))
        self.api_port = free_port()
        apply = "reload" if mode == "reload" else "live"
        self.dlog = os.path.join(self.tmp, "daemon.log")
        self.daemon = subprocess.Popen(
            [TRIBUTARY, "serve", "--listen", f"127.0.0.1:{self.api_port}",
             "--data-dir", os.path.join(self.tmp, "data"), "--plugins-dir", plugins,
             "--conf-dir", os.path.join(prefix, "conf"),
             "--test-cmd", " ".join(ngx + ["-t"]), "--reload-cmd", " ".join(ngx + ["-s", "reload"]),
             "--min-reload-gap-ms", "100", "--batch-quiet-ms", "5", "--batch-max-ms", "50",
             "--apply", apply, "--live-api", f"unix:{sock}:/api/"],
            stdout=subprocess.DEVNULL, stderr=open(self.dlog, "w"),
            env=dict(os.environ, RUST_LOG="info", NO_COLOR="1"))
        self.procs.append(self.daemon)
        wait_for(lambda: get(self.api_port, "/api/v1/health")[0] == 200, 30, "daemon")
        self.token = open(os.path.join(self.tmp, "data/token")).read().strip()
        # One backend per set, rotating: an answer from backend i+1 after change i was sent is
        # change i's (change i-4 with the same backend came 4 intervals earlier).
        self.sets = [(f"127.0.0.1:{backs[k]}", {f"b{k + 1}"}) for k in range(4)]
        self.i = 0
        st, v = api(self.api_port, self.token, "PUT", "/api/v1/bindings/bench?wait=true", self.body(0))
        assert st in (200, 201) and v["binding"]["last_outcome"]["status"] == "ok", v
        wait_for(lambda: get(self.front)[1] in self.sets[0][1], 10, "first set")

    def body(self, i):
        # `weights`: the same server, its weight alternating 1/2: every step of a live change
        # (save, plugin, write, nginx -t, PUT, read back) without moving any traffic.
        targets = (f"{self.sets[0][0]}:{1 + i % 2}" if self.mode == "weights"
                   else self.sets[i % 4][0])
        return {"plugin": "static", "provider": "static", "service": "bench",
                "config": {"targets": targets}, "directives": ["keepalive 16;"]}

    def log_counts(self):
        log = open(os.path.join(self.prefix, "logs/error.log")).read()
        return log.count("start worker process"), log.count("(SIGHUP) received")

    def cpu(self):
        """(nginx: master with reaped workers + live workers, daemon itself, the daemon's reaped
        commands), in CPU seconds."""
        ngx = cpu_s(self.master) + sum(cpu_s(c, reaped=False) for c in children(self.master))
        d = stat_fields(self.daemon.pid)
        return (ngx, (int(d[11]) + int(d[12])) / CLK, (int(d[13]) + int(d[14])) / CLK)

    def rss(self):
        return rss_kib(self.master) + sum(rss_kib(c) for c in children(self.master))

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM if p is not self.procs[0] else signal.SIGQUIT)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_segment(stack, seconds, interval_ms, connections, lua, change, probing=True):
    started0, reloads0 = stack.log_counts()
    cpu0 = stack.cpu()
    stop = threading.Event()
    rss_peak = [0]
    probes_out = []  # (sent, seen or None)

    def sample_rss():
        while not stop.is_set():
            rss_peak[0] = max(rss_peak[0], stack.rss())
            time.sleep(0.1)

    def probe(t0, want, slot):
        # New connections to the front server until an answer comes from the new set.
        while time.time() < t0 + 2:
            try:
                if get(stack.front, timeout=1)[1] in want:
                    slot[1] = time.time()
                    return
            except OSError:
                pass
            time.sleep(0.002)

    put_errors, sent = [0], [0]

    def drive():
        t_next = time.time()
        probes = []
        while not stop.is_set():
            t_next += interval_ms / 1000.0
            stack.i += 1
            i = stack.i
            t0 = time.time()
            try:
                st, _ = api(stack.api_port, stack.token, "PUT", "/api/v1/bindings/bench", stack.body(i))
                if st != 200:
                    put_errors[0] += 1
            except OSError:
                put_errors[0] += 1
            sent[0] += 1
            if stack.mode != "weights" and probing:
                slot = [t0, None, stack.sets[i % 4][0]]
                probes_out.append(slot)
                p = threading.Thread(target=probe, args=(t0, stack.sets[i % 4][1], slot))
                p.start()
                probes.append(p)
            pause = t_next - time.time()
            if pause > 0:
                time.sleep(pause)
        for p in probes:
            p.join()

    hist_path = os.path.join(stack.tmp, "hist.txt")
    sampler = threading.Thread(target=sample_rss)
    sampler.start()
    t_start = time.time()
    wrk = subprocess.Popen(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", lua,
         f"http://127.0.0.1:{stack.front}/"], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, WRK_HIST=hist_path))
    driver = None
    if change:
        driver = threading.Thread(target=drive)
        driver.start()
    wrk.communicate()
    t_end = time.time()
    stop.set()
    if driver:
        driver.join()
    sampler.join()
    time.sleep(0.3)
    started, reloads = stack.log_counts()
    cpu1 = stack.cpu()
    res = read_hist(hist_path)
    res.update({
        "seconds": t_end - t_start, "t_start": t_start, "t_end": t_end,
        "workers_started": started - started0, "reloads": reloads - reloads0,
        "rss_peak_kib": rss_peak[0], "changes_sent": sent[0], "put_errors": put_errors[0],
        "probes": probes_out,
        "cpu_nginx_s": cpu1[0] - cpu0[0], "cpu_daemon_s": cpu1[1] - cpu0[1],
        "cpu_commands_s": cpu1[2] - cpu0[2],
    })
    return res



def live_lines(path):
    """The daemon's "applied live" lines as dicts of their numeric fields."""
    out = []
    for line in open(path):
        if "applied live" not in line:
            continue
        fields = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)(?=\s|$)", line)}
        m = re.search(r"first_server=(\S+)", line)
        if m:
            fields["first_server"] = m.group(1).strip('"')
        out.append(fields)
    return out


def summarize(mode, segs, lines):
    hist = {}
    for s in segs:
        for v, n in s["hist"].items():
            hist[v] = hist.get(v, 0) + n
    seconds = sum(s["seconds"] for s in segs)
    probes = [p for s in segs for p in s["probes"]]
    save_seen, decided_seen, unseen = [], [], 0
    for sent, seen, _addr in probes:
        if seen is None:
            unseen += 1
        else:
            save_seen.append((seen - sent) * 1000)
    # A decision carries the bytes of the newest save of its set sent before it (saves that
    # arrive while a change is applied are coalesced: the newer bytes win); that save's prober
    # saw the change when it first got an answer from the set.
    for l in lines:
        d = l.get("decided_unix_ms", 0) / 1000.0
        addr = l.get("first_server")
        match = [p for p in probes if p[2] == addr and p[0] <= d]
        if match:
            seen = max(match, key=lambda p: p[0])[1]
            if seen is not None and seen >= d:
                decided_seen.append((seen - d) * 1000)
    err = [sum(s["errors"][i] for s in segs) for i in range(5)]
    r = {
        "mode": mode, "segments": len(segs), "seconds": seconds,
        "requests": sum(s["requests"] for s in segs),
        "rps": sum(s["requests"] for s in segs) / seconds,
        "p50_ms": hist_pct(hist, .5) / 1000, "p99_ms": hist_pct(hist, .99) / 1000,
        "max_ms": max(hist) / 1000 if hist else float("nan"),
        "segment_p99_ms": [hist_pct(s["hist"], .99) / 1000 for s in segs],
        "non2xx": err[3], "socket_errors": err[0] + err[1] + err[2] + err[4],
        "changes_sent": sum(s["changes_sent"] for s in segs),
        "put_errors": sum(s["put_errors"] for s in segs),
        "reloads": sum(s["reloads"] for s in segs),
        "workers_started": sum(s["workers_started"] for s in segs),
        "rss_peak_kib": max(s["rss_peak_kib"] for s in segs),
        "cpu_nginx_s": sum(s["cpu_nginx_s"] for s in segs),
        "cpu_daemon_s": sum(s["cpu_daemon_s"] for s in segs),
        "cpu_commands_s": sum(s["cpu_commands_s"] for s in segs),
        "save_seen_ms": save_seen, "decided_seen_ms": decided_seen, "not_seen_within_2s": unseen,
        "live": lines,
    }
    return r


def fmt3(v, digits=1):
    if not v:
        return "-"
    return "/".join(f"{pct(v, q):.{digits}f}" for q in (.5, .99)) + f"/{max(v):.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60, help="load per mode in total")
    ap.add_argument("--segment-seconds", type=int, default=10)
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--modes", default="none,live,reload",
                    help="none, live, reload, weights (live changes of one server's weight), twin "
                         "(a second none: how far two identical stacks differ)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--think-ms", type=int, default=0,
                    help="each wrk connection waits this long after an answer (0: saturating load)")
    ap.add_argument("--no-probe", action="store_true",
                    help="no prober (its new connections are load too); no save→seen figures")
    a = ap.parse_args()
    for need in [SO, TRIBUTARY, STATIC_PLUGIN]:
        if not os.path.exists(need):
            sys.exit(f"bench-live: {need} is missing (see the build commands at the top of this script)")
    if not shutil.which("wrk") or not shutil.which("nginx"):
        sys.exit("bench-live: needs wrk and nginx (scripts/setup.sh)")
    modes = a.modes.split(",")
    rounds = max(1, a.seconds // a.segment_seconds)
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}  cpus: {os.cpu_count()}")
    print(f"{rounds} rounds of {a.segment_seconds} s per mode ({', '.join(modes)}; order rotated each "
          f"round), wrk -c{a.connections}" + (f" with {a.think_ms} ms think time" if a.think_ms else "")
          + f", a change every {a.interval_ms} ms in live/reload", flush=True)
    stacks, segs = {}, {m: [] for m in modes}
    lua = None
    try:
        for m in modes:
            stacks[m] = Stack(m)
        lua = os.path.join(stacks[modes[0]].tmp, "hist.lua")
        with open(lua, "w") as f:
            f.write(WRK_LUA)
            if a.think_ms:
                f.write(f"delay = function() return {a.think_ms} end\n")
        time.sleep(1.0)
        for r in range(rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for m in order:
                s = run_segment(stacks[m], a.segment_seconds, a.interval_ms, a.connections, lua,
                                change=(m not in IDLE), probing=not a.no_probe)
                segs[m].append(s)
                print(f"  round {r + 1} {m}: p99 {hist_pct(s['hist'], .99) / 1000:.2f} ms, "
                      f"{s['requests'] / s['seconds']:.0f} req/s, {s['reloads']} reloads", flush=True)
                time.sleep(0.5)
        results = {}
        for m in modes:
            results[m] = summarize(m, segs[m], live_lines(stacks[m].dlog) if m != "reload" else [])
    finally:
        for s in stacks.values():
            s.stop()
    print()
    print("| mode | req/s | p50 ms | p99 ms (segments min/median/max) | max ms | non-2xx | socket errors "
          "| changes | reloads | workers started | nginx RSS peak MiB | CPU s nginx / daemon / its commands |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m, r in results.items():
        sp = r["segment_p99_ms"]
        print(f"| {m} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} ({min(sp):.1f}/{pct(sp, .5):.1f}/{max(sp):.1f}) "
              f"| {r['max_ms']:.1f} | {r['non2xx']} | {r['socket_errors']} | {r['changes_sent']} | {r['reloads']} "
              f"| {r['workers_started']} | {r['rss_peak_kib'] / 1024:.1f} "
              f"| {r['cpu_nginx_s']:.1f} / {r['cpu_daemon_s']:.1f} / {r['cpu_commands_s']:.1f} |")
    print()
    print("change latency, p50/p99/max ms (n):")
    for m, r in results.items():
        if m in IDLE:
            continue
        print(f"  {m}: save→seen {fmt3(r['save_seen_ms'])} ({len(r['save_seen_ms'])}, "
              f"{r['not_seen_within_2s']} not within 2 s); decided→seen (outside) {fmt3(r['decided_seen_ms'])} "
              f"({len(r['decided_seen_ms'])})")
        lines = r["live"]
        if lines:
            col = lambda k: [l[k] for l in lines if k in l]
            print(f"    daemon ({len(lines)} live changes): decided→visible {fmt3(col('decided_to_visible_ms'))}, "
                  f"decided→confirmed {fmt3(col('decided_to_confirmed_ms'))}")
            print("    components p50/p99/max: " + ", ".join(
                f"{k[:-3]} {fmt3(col(k), 2)}" for k in
                ["waited_ms", "write_ms", "test_ms", "list_wait_ms", "put_ms", "readback_ms"]))
            vis = col("decided_to_visible_ms")
            print(f"    decided→visible under 50 ms: {sum(1 for v in vis if v < 50)}/{len(vis)}")
    base = results.get("none")
    if base:
        for m, r in results.items():
            if m == "none":
                continue
            per_round = [x / y for x, y in zip(r["segment_p99_ms"], base["segment_p99_ms"])]
            seg_med = pct(r["segment_p99_ms"], .5) / pct(base["segment_p99_ms"], .5)
            print(f"{m} / none: req/s {r['rps'] / base['rps']:.3f}, p99 {r['p99_ms'] / base['p99_ms']:.3f} "
                  f"(median segment p99 {seg_med:.3f}) "
                  f"(per round min/median/max {min(per_round):.2f}/{pct(per_round, .5):.2f}/{max(per_round):.2f}), "
                  f"p50 {r['p50_ms'] / base['p50_ms']:.3f}, max {r['max_ms'] / base['max_ms']:.3f}, "
                  f"RSS peak {r['rss_peak_kib'] / max(1, base['rss_peak_kib']):.3f}, "
                  f"nginx CPU per request {(r['cpu_nginx_s'] / max(1, r['requests'])) / (base['cpu_nginx_s'] / max(1, base['requests'])):.3f}")
    with open("/proc/loadavg") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
