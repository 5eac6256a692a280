#!/usr/bin/env python3
"""The job-queue goals of one benchmark sitting (packaging/scripts/bench-sitting.sh).

Usage: bench_summary.py OURS.jsonl [PEERS.jsonl]

Reads backhaul-bench's result lines and, when given, the peers' (shared/bench/peers), and prints
Markdown: a table of the goals, each with our figure (median [min-max] of the runs), the row of
ours it uses and whether it is met; then our three job shapes beside the peers' rows. Lines that
are not JSON objects are ignored. W1 and W2 lines count only with the workload's n (W1 20000,
W2 5000; the 1,000,000-job W1 runs apart) and ok=true: the others are dropped, and counted.
"""
import json
import os
import statistics
import sys
from collections import defaultdict

WORKLOAD_N = {"W1": 20000, "W2": 5000}
BIG_N = 1000000

# Our job shapes (docs/benchmarks.md). The peers' primary rows take one job per claim with 8 in
# flight, each worker fetching its own; their TUNED rows keep at most 8 in flight with batched
# claims. Ours claim through one claim loop (the daemon's default) or one per worker (--claimers).
STRICT1, STRICT, DEFAULT1, DEFAULT, P256 = "strict, 1 loop", "strict", "default, 1 loop", \
    "default", "prefetch 256"
SHAPE_LABEL = {
    STRICT1: "`--claim-batch 1 --prefetch 0`: 1 job per claim, 1 claim loop, ≤ 8 in flight",
    STRICT: "`--claim-batch 1 --prefetch 0 --claimers 8`: 1 job per claim, a claim loop per "
            "worker, ≤ 8 in flight (as the peers' primary rows)",
    DEFAULT1: "defaults: up to 8 jobs per claim, 1 claim loop, ≤ 8 in flight",
    DEFAULT: "`--claimers 8`: up to 8 jobs per claim, a claim loop per worker, ≤ 8 in flight "
             "(as the peers' TUNED rows)",
    P256: "`--claim-batch 256 --prefetch 256`: up to 264 leased, more in flight than any peer row",
}
P256_NOTE = "prefetch 256: more in flight than any peer row"


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


def keep(rows, big=False):
    """The lines that count, and how many W1/W2 lines were dropped (wrong n, or not ok); `big`
    also keeps W1 lines of BIG_N jobs (ours)."""
    kept, wrong_n, not_ok = [], 0, 0
    for r in rows:
        n = r.get("n")
        if r.get("workload") in WORKLOAD_N:
            if n != WORKLOAD_N[r["workload"]] and not (big and r["workload"] == "W1" and n == BIG_N):
                wrong_n += 1
                continue
            if r.get("ok") is not True:
                not_ok += 1
                continue
        kept.append(r)
    return kept, wrong_n, not_ok


def shape(r):
    s = r.get("settings") or {}
    batch, prefetch = s.get("claim_batch"), s.get("prefetch", 0)
    workers, claimers = s.get("workers", 8), s.get("claimers", 1)  # older lines: one loop
    loops = {1: 1, workers: "each"}.get(claimers)
    if prefetch == 0 and batch == 1 and loops:
        return STRICT1 if loops == 1 else STRICT
    if prefetch == 0 and batch == workers and loops:
        return DEFAULT1 if loops == 1 else DEFAULT
    if prefetch == 256 and batch == 256 and claimers == 1:
        return P256
    return None


def spread(values, digits=0):
    if not values:
        return "none"
    fmt = (lambda v: f"{v:,.{digits}f}")
    return f"{fmt(statistics.median(values))} [{fmt(min(values))}–{fmt(max(values))}]"


def ours_runs(rows, store, workload, processes=1, shape_=P256, keys=1, cap=0, n=None):
    out = []
    for r in rows:
        s = r.get("settings") or {}
        if (r.get("config") != store or r.get("workload") != workload
                or r.get("processes", 1) != processes):
            continue
        if workload == "latency":
            out.append(r)
            continue
        if shape(r) != shape_ or s.get("keys", 1) != keys or s.get("per_key_cap", 0) != cap:
            continue
        if r.get("n") != (n if n is not None else WORKLOAD_N[workload]):
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


def peer_label(config):
    if config.startswith("TUNED"):
        return "TUNED: ≤ 8 in flight, batched claims"
    return "primary: 1 job per claim, 8 in flight"


def cap_cost(free, capped):
    """1 - capped/free for e2e and processing jobs/s (medians)."""
    return [1 - median(field(capped, f)) / median(field(free, f))
            for f in ("jobs_per_s", "process_jobs_per_s")]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    ours_all = read(sys.argv[1])
    peers_all = read(sys.argv[2]) if len(sys.argv) == 3 else []
    bad = [r for r in ours_all if r.get("workload") != "latency" and not r.get("ok")]
    ours, ours_wrong_n, ours_not_ok = keep(ours_all, big=True)
    peers, peers_wrong_n, peers_not_ok = keep(peers_all)

    peer_rows = defaultdict(lambda: defaultdict(list))
    for r in peers:
        peer_rows[(r["peer"], r.get("config", ""))][r["workload"]].append(r)
    best_w2 = None
    for (peer, config), by in peer_rows.items():
        m = median(field(by.get("W2", []), "seconds"))
        if m is not None and (best_w2 is None or m < best_w2[0]):
            best_w2 = (m, f"{peer} `{config}`")

    lines = ["| goal | our row used | this sitting | verdict |", "|---|---|---|---|"]

    def row(goal, used, figure, ok):
        lines.append(f"| {goal} | {used} | {figure} | {verdict(ok)} |")

    sq_w1 = ours_runs(ours, "sqlite", "W1")
    e2e = field(sq_w1, "jobs_per_s")
    row("SQLite W1 e2e ≥ 50,000 jobs/s", P256_NOTE,
        f"{spread(e2e)}; processing {spread(field(sq_w1, 'process_jobs_per_s'))}",
        median(e2e) >= 50000 if e2e else None)

    for store, name in (("sqlite", "SQLite"), ("mysql", "MySQL")):
        w2 = field(ours_runs(ours, store, "W2"), "seconds")
        if w2 and best_w2:
            ratio = best_w2[0] / median(w2)
            row(f"{name} W2 ≥ 2× the best peer ({best_w2[1]}: {best_w2[0]:.3f} s e2e)", P256_NOTE,
                f"{spread(w2, 3)} s → {ratio:.2f}×", ratio >= 2)
        else:
            row(f"{name} W2 ≥ 2× the best peer", P256_NOTE, f"{spread(w2, 3)} s", None)

    lat = ours_runs(ours, "sqlite", "latency")
    p50, p99 = field(lat, "p50_ms"), field(lat, "p99_ms")
    row("SQLite enqueue→start p50 < 1 ms, p99 < 5 ms (each run)",
        "latency: defaults, one job at a time",
        "p50 " + " / ".join(f"{v:.3f}" for v in p50) + "; p99 " +
        " / ".join(f"{v:.2f}" for v in p99) + " ms",
        (max(p50) < 1 and max(p99) < 5) if lat else None)

    big = ours_runs(ours, "sqlite", "W1", n=BIG_N)
    base = median(field(sq_w1, "process_jobs_per_s"))
    if big and base:
        rate, rss = median(field(big, "process_jobs_per_s")), median(field(big, "client_rss_kb"))
        row("1,000,000 queued: processing within 20% of the 20k run; RSS < 64 MB",
            P256_NOTE,
            f"{rate:,.0f} against {base:,.0f} ({100 * (rate / base - 1):+.1f}%); "
            f"RSS {rss / 1024:.1f} MB (medians of {len(big)} runs: processing "
            f"{spread(field(big, 'process_jobs_per_s'))})",
            rate >= 0.8 * base and rss < 64 * 1024)
    else:
        row("1,000,000 queued", P256_NOTE, "not run", None)

    free = ours_runs(ours, "sqlite", "W1", keys=10)
    capped = ours_runs(ours, "sqlite", "W1", keys=10, cap=1000)
    if free and capped:
        costs = cap_cost(free, capped)
        row("exact per-key caps cost ≤ 10% (10 keys; a non-binding cap, 1000 per key, against none)",
            P256_NOTE,
            f"e2e {spread(field(capped, 'jobs_per_s'))} against "
            f"{spread(field(free, 'jobs_per_s'))} ({-100 * costs[0]:+.1f}%); processing "
            f"{-100 * costs[1]:+.1f}%", max(costs) <= 0.10)

    my1 = field(ours_runs(ours, "mysql", "W1"), "jobs_per_s")
    row("MySQL W1 e2e ≥ 10,000 jobs/s (1 daemon)", P256_NOTE, spread(my1),
        median(my1) >= 10000 if my1 else None)
    my3 = field(ours_runs(ours, "mysql", "W1", processes=3), "jobs_per_s")
    row("MySQL W1, 3 daemons > 1 daemon", P256_NOTE, f"{spread(my3)} against {spread(my1)}",
        median(my3) > median(my1) if my1 and my3 else None)

    print("\n".join(lines))
    print(f"\nEvery goal verdict above uses the row named beside it; rows marked \"{P256_NOTE}\" "
          "keep up to 264 jobs leased (claim batch 256 + prefetch 256 + 8 workers), where the "
          "peers' rows keep at most 8. The rows below give the same workloads in the peers' shapes.")

    bind_free = ours_runs(ours, "sqlite", "W1", shape_=DEFAULT1, keys=10)
    bind_capped = ours_runs(ours, "sqlite", "W1", shape_=DEFAULT1, keys=10, cap=1)
    if bind_free and bind_capped:
        costs = cap_cost(bind_free, bind_capped)
        print(f"\nBinding cap (no goal; defaults, 10 keys, cap 1 per key against none): e2e "
              f"{spread(field(bind_capped, 'jobs_per_s'))} against "
              f"{spread(field(bind_free, 'jobs_per_s'))} jobs/s ({-100 * costs[0]:+.1f}%); "
              f"processing {-100 * costs[1]:+.1f}%.")

    table = ["| queue | row | shape | W1 e2e jobs/s | W1 processing jobs/s | W2 e2e s | "
             "W1 CPU, server + client s |", "|---|---|---|---|---|---|---|"]
    for (peer, config), by in peer_rows.items():
        w1 = by.get("W1", [])
        table.append(f"| {peer} | `{config}` | {peer_label(config)} | "
                     f"{spread(field(w1, 'jobs_per_s'))} | "
                     f"{spread(field(w1, 'process_jobs_per_s'))} | "
                     f"{spread(field(by.get('W2', []), 'seconds'), 3)} | {cpu_figure(w1)} |")
    for store in ("sqlite", "mysql"):
        for shape_ in (STRICT1, STRICT, DEFAULT1, DEFAULT, P256):
            w1 = ours_runs(ours, store, "W1", shape_=shape_)
            w2 = ours_runs(ours, store, "W2", shape_=shape_)
            if w1 or w2:
                table.append(f"| backhaul | {store} | {SHAPE_LABEL[shape_]} | "
                             f"{spread(field(w1, 'jobs_per_s'))} | "
                             f"{spread(field(w1, 'process_jobs_per_s'))} | "
                             f"{spread(field(w2, 'seconds'), 3)} | {cpu_figure(w1)} |")
    print("\n" + "\n".join(table))

    cpu = []
    for label, runs in (("W1, 1 daemon", ours_runs(ours, "mysql", "W1")),
                        ("W1, 3 daemons", ours_runs(ours, "mysql", "W1", processes=3)),
                        ("W2", ours_runs(ours, "mysql", "W2"))):
        if field(runs, "server_cpu_s"):
            cpu.append(f"{label} {cpu_figure(runs)}")
    if cpu:
        print(f"\nMySQL CPU per run, {P256_NOTE}, server + clients (user+system s, medians; the "
              f"server's includes the run's setup), on {os.cpu_count()} CPUs: " + "; ".join(cpu) + ".")

    dropped = []
    if ours_wrong_n or ours_not_ok:
        dropped.append(f"ours: {ours_wrong_n} with another n, {ours_not_ok} not ok")
    if peers_wrong_n or peers_not_ok:
        dropped.append(f"peers: {peers_wrong_n} with another n, {peers_not_ok} not ok")
    print("\nW1/W2 lines dropped (n other than W1 20000 / W2 5000 / W1 1,000,000 for ours, or "
          "ok not true): " + ("; ".join(dropped) if dropped else "none") + ".")
    if bad:
        print(f"\n{len(bad)} of our runs were not ok (wrong final state): see the lines with \"ok\":false")
        sys.exit(1)


if __name__ == "__main__":
    main()
