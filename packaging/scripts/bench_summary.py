#!/usr/bin/env python3
"""The job-queue goals of one benchmark sitting (packaging/scripts/bench-sitting.sh).

Usage: bench_summary.py OURS.jsonl [PEERS.jsonl]

Reads backhaul-bench's result lines and, when given, the peers' (shared/bench/peers), and prints
a Markdown table: each goal, our figure (median [min-max] of the runs) and whether it is met.
Lines that are not JSON objects are ignored.
"""
import json
import os
import statistics
import sys
from collections import defaultdict


def read(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                if "workload" in row:
                    rows.append(row)
    return rows


def spread(values, digits=0):
    if not values:
        return "none"
    fmt = (lambda v: f"{v:,.{digits}f}")
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}–{fmt(max(values))}]"


def ours_runs(rows, store, workload, processes=1, tuned=True, keys=1, cap=0, n=None):
    out = []
    for r in rows:
        s = r.get("settings") or {}
        if (r.get("config") != store or r.get("workload") != workload
                or r.get("processes", 1) != processes):
            continue
        if workload == "latency":
            out.append(r)
            continue
        if (s.get("prefetch", 0) > 0) != tuned or s.get("keys", 1) != keys:
            continue
        if s.get("per_key_cap", 0) != cap or (n is not None and r.get("n") != n):
            continue
        if n is None and r.get("n") not in (20000, 5000):
            continue
        out.append(r)
    return out


def field(runs, name):
    return [r[name] for r in runs if r.get(name) is not None]


def median(values):
    return statistics.median(values) if values else None


def cpu_figure(runs):
    server, client = median(field(runs, "server_cpu_s")), median(field(runs, "client_cpu_s"))
    if server is None or client is None:
        return "n/a"
    return f"{server:.2f} + {client:.2f}"


def verdict(ok):
    if ok is None:
        return "n/a"
    return "✓" if ok else "✗"


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    ours = read(sys.argv[1])
    peers = read(sys.argv[2]) if len(sys.argv) == 3 else []
    bad = [r for r in ours if r.get("workload") != "latency" and not r.get("ok")]

    peer_rows = defaultdict(lambda: defaultdict(list))
    for r in peers:
        peer_rows[(r["peer"], r.get("config", ""))][r["workload"]].append(r)
    best_w2 = None
    for (peer, config), by in peer_rows.items():
        m = median(field(by.get("W2", []), "seconds"))
        if m is not None and (best_w2 is None or m < best_w2[0]):
            best_w2 = (m, f"{peer} `{config}`")

    lines = ["| goal | this sitting | verdict |", "|---|---|---|"]

    def row(goal, figure, ok):
        lines.append(f"| {goal} | {figure} | {verdict(ok)} |")

    sq_w1 = ours_runs(ours, "sqlite", "W1")
    e2e = field(sq_w1, "jobs_per_s")
    row("SQLite W1 e2e ≥ 50,000 jobs/s (tuned)",
        f"{spread(e2e)}; processing {spread(field(sq_w1, 'process_jobs_per_s'))}",
        median(e2e) >= 50000 if e2e else None)

    for store, name in (("sqlite", "SQLite"), ("mysql", "MySQL")):
        w2 = field(ours_runs(ours, store, "W2"), "seconds")
        if w2 and best_w2:
            ratio = best_w2[0] / median(w2)
            row(f"{name} W2 ≥ 2× the best peer ({best_w2[1]}: {best_w2[0]:.3f} s)",
                f"{spread(w2, 3)} s → {ratio:.2f}×", ratio >= 2)
        else:
            row(f"{name} W2 ≥ 2× the best peer", f"{spread(w2, 3)} s", None)

    lat = ours_runs(ours, "sqlite", "latency")
    p50, p99 = field(lat, "p50_ms"), field(lat, "p99_ms")
    row("SQLite enqueue→start p50 < 1 ms, p99 < 5 ms (each run)",
        "p50 " + " / ".join(f"{v:.3f}" for v in p50) + "; p99 " +
        " / ".join(f"{v:.2f}" for v in p99) + " ms",
        (max(p50) < 1 and max(p99) < 5) if lat else None)

    big = ours_runs(ours, "sqlite", "W1", n=1000000)
    base = median(field(sq_w1, "process_jobs_per_s"))
    if big and base:
        rate, rss = big[0]["process_jobs_per_s"], big[0]["client_rss_kb"]
        row("1,000,000 queued: processing within 20% of the 20k run; RSS < 64 MB",
            f"{rate:,.0f} against {base:,.0f} ({100 * (rate / base - 1):+.1f}%); "
            f"RSS {rss / 1024:.1f} MB", rate >= 0.8 * base and rss < 64 * 1024)
    else:
        row("1,000,000 queued", "not run", None)

    free = ours_runs(ours, "sqlite", "W1", keys=10)
    capped = ours_runs(ours, "sqlite", "W1", keys=10, cap=1000)
    if free and capped:
        costs = [1 - median(field(capped, f)) / median(field(free, f))
                 for f in ("jobs_per_s", "process_jobs_per_s")]
        row("exact per-key caps cost ≤ 10% (10 keys, cap 1000 against none)",
            f"e2e {spread(field(capped, 'jobs_per_s'))} against "
            f"{spread(field(free, 'jobs_per_s'))} ({-100 * costs[0]:+.1f}%); processing "
            f"{-100 * costs[1]:+.1f}%", max(costs) <= 0.10)

    my1 = field(ours_runs(ours, "mysql", "W1"), "jobs_per_s")
    row("MySQL W1 e2e ≥ 10,000 jobs/s (1 daemon, tuned)", spread(my1),
        median(my1) >= 10000 if my1 else None)
    my3 = field(ours_runs(ours, "mysql", "W1", processes=3), "jobs_per_s")
    row("MySQL W1, 3 daemons > 1 daemon", f"{spread(my3)} against {spread(my1)}",
        median(my3) > median(my1) if my1 and my3 else None)

    print("\n".join(lines))
    defaults = []
    for store, workload, unit in (("sqlite", "W1", "jobs/s"), ("sqlite", "W2", "s"),
                                  ("mysql", "W1", "jobs/s"), ("mysql", "W2", "s")):
        runs = ours_runs(ours, store, workload, tuned=False)
        key = "jobs_per_s" if unit == "jobs/s" else "seconds"
        if runs:
            defaults.append(f"{store} {workload} {spread(field(runs, key), 0 if unit == 'jobs/s' else 3)} {unit}")
    if defaults:
        print("\nDefaults (no tuning flags): " + "; ".join(defaults) + ".")
    cpu = []
    for label, runs in (("W1, 1 daemon", ours_runs(ours, "mysql", "W1")),
                        ("W1, 3 daemons", ours_runs(ours, "mysql", "W1", processes=3)),
                        ("W2", ours_runs(ours, "mysql", "W2"))):
        if field(runs, "server_cpu_s"):
            cpu.append(f"{label} {cpu_figure(runs)}")
    if cpu:
        print(f"\nMySQL CPU per run, server + clients (user+system s, medians; the server's includes "
              f"the run's setup), on {os.cpu_count()} CPUs: " + "; ".join(cpu) + ".")
    if peer_rows:
        print("\n| peer | W1 e2e jobs/s | W2 s | W1 CPU, server + client s |\n|---|---|---|---|")
        for (peer, config), by in peer_rows.items():
            print(f"| {peer} `{config}` | {spread(field(by.get('W1', []), 'jobs_per_s'))} | "
                  f"{spread(field(by.get('W2', []), 'seconds'), 3)} | "
                  f"{cpu_figure(by.get('W1', []))} |")
    if bad:
        print(f"\n{len(bad)} of our runs were not ok (wrong final state): see the lines with \"ok\":false")
        sys.exit(1)


if __name__ == "__main__":
    main()
