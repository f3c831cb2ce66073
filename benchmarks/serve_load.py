"""Load benchmark of ``xinda serve`` (issue 13): batching across requests on vs off, and a queue
too small for the load.

    python benchmarks/serve_load.py [--model runs/serve/multi30k-en-de-1315] [--clients 50]
        [--seconds 60] [--warmup 5] [--repeats 1] [--threads 0] [--precision fp32|int8]
        [--out-dir docs/results]

Each run starts its own ``xinda serve`` on a free 127.0.0.1 port, waits for /health, then
``--clients`` concurrent clients (asyncio + httpx, one kept-alive connection each) loop for
``--warmup`` + ``--seconds`` seconds: pick 1-5 random source lines, POST /v1/translate, record
latency and status. Requests that end inside the measured window count, whenever they started.
Reports requests/s, sentences/s, p50/p95/p99 latency of the 200s, errors by status, the
server's RSS (VmRSS) at the start and end of the window and the mean batch size (/metrics).
Runs: batching on and off (``--repeats`` interleaved pairs, medians), then batching on with
``--queue-size 4`` once (only clean 429s expected). Checks the issue's targets (PASS/FAIL) and
writes ``serve_load.{json,md}`` to ``--out-dir``. Not a test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import ROOT, SERVE_MODEL, SERVE_MODEL_HINT, SHARED, markdown_table

STARTUP_S = 180  # imports torch and loads the model on a busy machine
STOP_S = 15  # SIGTERM, then SIGKILL after this long
BACKOFF_S = 0.05  # a client's pause after a refusal (keeps 429s from spinning the CPU)
SMALL_QUEUE = 4
RUNS = {"on": [], "off": ["--no-batching"], "small-queue": ["--queue-size", str(SMALL_QUEUE)]}


@dataclass
class Sample:
    """One request: when it started and ended (monotonic s), its status and sentence count."""

    start: float
    end: float
    status: str  # "200", "429", ..., or "timeout" / "connection: <error>"
    sentences: int


@dataclass
class Server:
    """A running ``xinda serve``: its process, base URL and log file."""

    proc: subprocess.Popen
    base: str
    log: Path
    samples: list[Sample] = field(default_factory=list)


def free_port() -> int:
    """A port on 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    """The resident set size (VmRSS) of process ``pid`` in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)[1]) / 1024


def start_server(model: Path, options: list[str], threads: int, port: int, log: Path) -> Server:
    """Start ``python -m xinda.cli serve`` (so the PID is the server's) and wait for /health."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads:  # else the server's default (torch's: one per core)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "xinda.cli", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--threads", str(threads), *options]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        wait_healthy(server)
    except BaseException:
        stop_server(server)
        raise
    return server


def wait_healthy(server: Server) -> None:
    """Poll /health until it answers 200 (bounded; fails on an exited server)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            sys.exit(f"xinda serve exited with {server.proc.returncode}:\n{tail(server.log)}")
        try:
            if httpx.get(server.base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    sys.exit(f"xinda serve not up after {STARTUP_S} s:\n{tail(server.log)}")


def stop_server(server: Server) -> None:
    """SIGTERM, then SIGKILL when it has not exited within STOP_S."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(STOP_S)


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:]


def batch_sums(metrics: str) -> dict[str, float]:
    """Sums over models of the batch-size histograms' _sum and _count in /metrics text."""
    sums: dict[str, float] = {}
    for name in ("xinda_batch_requests", "xinda_batch_sentences"):
        for part in ("sum", "count"):
            pattern = rf"^{name}_{part}(?:{{[^}}]*}})? (\S+)$"
            values = re.findall(pattern, metrics, re.MULTILINE)
            sums[f"{name}_{part}"] = sum(float(v) for v in values)
    return sums


def scrape(server: Server) -> dict[str, float]:
    return batch_sums(httpx.get(server.base + "/metrics", timeout=10).text)


def mean_batch(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Mean of histogram ``name`` between two scrapes (None without batches)."""
    count = after[f"{name}_count"] - before[f"{name}_count"]
    return (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else None


async def post(client: httpx.AsyncClient, body: dict) -> str:
    """POST /v1/translate; the status as a string (a 429 counts only with Retry-After and
    code queue_full), or the client-side failure."""
    try:
        response = await client.post("/v1/translate", json=body)
    except httpx.TimeoutException:
        return "timeout"
    except httpx.TransportError as err:
        return f"connection: {type(err).__name__}"
    if response.status_code == 429:
        clean = "retry-after" in response.headers and \
            response.json().get("error", {}).get("code") == "queue_full"
        return "429" if clean else "429 without Retry-After/queue_full"
    return str(response.status_code)


async def client_loop(server: Server, sources: list[str], seed: int, beam: int | None,
                      timeout: float, end: float) -> None:
    """One client: a kept-alive connection, random 1-5 line requests until ``end``."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=server.base, timeout=timeout, limits=limits) as client:
        while time.monotonic() < end:
            text = rng.sample(sources, rng.randint(1, 5))
            body = {"text": text} | ({"beam": beam} if beam else {})
            start = time.monotonic()
            status = await post(client, body)
            server.samples.append(Sample(start, time.monotonic(), status, len(text)))
            if status != "200":
                await asyncio.sleep(BACKOFF_S)


async def load(server: Server, sources: list[str], args: argparse.Namespace,
               run_seed: int) -> dict:
    """Run the clients; measure RSS and /metrics at the window's start and end."""
    t0 = time.monotonic()
    window = (t0 + args.warmup, t0 + args.warmup + args.seconds)
    tasks = [asyncio.create_task(client_loop(server, sources, run_seed * 1000 + i, args.beam,
                                             args.request_timeout, window[1]))
             for i in range(args.clients)]
    await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
    rss_start, before = rss_mb(server.proc.pid), await asyncio.to_thread(scrape, server)
    await asyncio.wait(tasks, timeout=max(0.0, window[1] - time.monotonic()))
    rss_end, after = rss_mb(server.proc.pid), await asyncio.to_thread(scrape, server)
    for task in tasks:  # the run ends at its time: requests still out are dropped
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"rss_start_mb": round(rss_start, 1), "rss_end_mb": round(rss_end, 1),
            "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 2),
            "mean_batch_requests": rounded(mean_batch(before, after, "xinda_batch_requests")),
            "mean_batch_sentences": rounded(mean_batch(before, after, "xinda_batch_sentences")),
            **summarize(server.samples, window)}


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summarize(samples: list[Sample], window: tuple[float, float]) -> dict:
    """Throughput, latency of the 200s and errors of the requests that end inside ``window``,
    whenever they started (counting only those that also start inside would leave out about
    one request per client at each end: more of the slow runs' throughput than the fast's)."""
    inside = [s for s in samples if window[0] <= s.end <= window[1]]
    ok = [s for s in inside if s.status == "200"]
    seconds = window[1] - window[0]
    latencies = [1000 * (s.end - s.start) for s in ok]
    return {"requests": len(ok), "sentences": sum(s.sentences for s in ok),
            "requests_per_s": round(len(ok) / seconds, 2),
            "sentences_per_s": round(sum(s.sentences for s in ok) / seconds, 2),
            **{f"p{q}_ms": rounded(percentile(latencies, q), 1) for q in (50, 95, 99)},
            "errors": dict(sorted(Counter(s.status for s in inside if s.status != "200").items()))}


def one_run(name: str, repeat: int, model: Path, sources: list[str],
            args: argparse.Namespace) -> dict:
    """Start a server with run ``name``'s options, load it, stop it; the run's results."""
    print(f"run {name} (repeat {repeat + 1}): {args.clients} clients, {args.warmup:g} s warm-up "
          f"+ {args.seconds:g} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        options = RUNS[name] + (["--precision", args.precision] if args.precision else [])
        server = start_server(model, options, args.threads, args.port, Path(tmp) / "log")
        try:
            result = asyncio.run(load(server, sources, args, args.seed + repeat))
        finally:
            stop_server(server)
    result = {"run": name, "repeat": repeat + 1, "server_options": RUNS[name], **result}
    print("  " + json.dumps(result), flush=True)
    return result


def run_order(repeats: int) -> list[tuple[str, int]]:
    """On/off pairs interleaved (on-off, off-on, ...), then the small-queue run once."""
    pairs = [(("on", "off") if r % 2 == 0 else ("off", "on"), r) for r in range(repeats)]
    return [(name, r) for names, r in pairs for name in names] + [("small-queue", 0)]


def medians(runs: list[dict], name: str) -> dict:
    """Median of each numeric measure over the runs called ``name``."""
    chosen = [r for r in runs if r["run"] == name]
    keys = [k for k, v in chosen[0].items() if isinstance(v, (int, float)) and k != "repeat"]
    return {k: rounded(statistics.median(r[k] for r in chosen if r[k] is not None))
            if any(r[k] is not None for r in chosen) else None for k in keys}


def checks(runs: list[dict], ratio: float | None) -> list[dict]:
    """The issue's targets, each {"target", "pass", "detail"}."""
    pair = [r for r in runs if r["run"] in ("on", "off")]
    pair_errors = sum(sum(r["errors"].values()) for r in pair)
    growth = max(r["rss_growth_pct"] for r in runs)
    small = next(r for r in runs if r["run"] == "small-queue")["errors"]
    others = {k: v for k, v in small.items() if k != "429"}
    return [
        {"target": "0 errors with batching on and off", "pass": pair_errors == 0,
         "detail": f"{pair_errors} errors"},
        {"target": "RSS growth < 10 %", "pass": growth < 10, "detail": f"max {growth:.2f} %"},
        {"target": "batching >= 3x sentences/s of no batching", "pass": (ratio or 0) >= 3,
         "detail": f"ratio {ratio}"},
        {"target": f"queue of {SMALL_QUEUE}: only clean 429s", "pass": bool(small.get("429"))
         and not others, "detail": f"errors {small}" if small else "no 429 seen"},
    ]


def report(runs: list[dict], summary: dict, args: argparse.Namespace) -> str:
    """The Markdown report: one row per run (plus medians), the ratio and the checks."""
    header = ["run", "req/s", "sent/s", "p50 ms", "p95 ms", "p99 ms", "errors", "RSS MB",
              "RSS growth %", "mean batch (req)"]
    rows = [[f"{r['run']} #{r['repeat']}", r["requests_per_s"], r["sentences_per_s"],
             r["p50_ms"], r["p95_ms"], r["p99_ms"], errors_text(r["errors"]),
             f"{r['rss_start_mb']} -> {r['rss_end_mb']}", r["rss_growth_pct"],
             r["mean_batch_requests"]] for r in runs]
    if args.repeats > 1:
        rows += [[f"{name} (median)", m["requests_per_s"], m["sentences_per_s"], m["p50_ms"],
                  m["p95_ms"], m["p99_ms"], "", "", m["rss_growth_pct"],
                  m["mean_batch_requests"]]
                 for name, m in summary["medians"].items()]
    title = (f"`xinda serve` load: {summary['model']}, {args.clients} clients, "
             f"{args.seconds:g} s (+{args.warmup:g} s warm-up), "
             f"server threads {args.threads or 'default'}, "
             f"{os.cpu_count()} CPUs")
    lines = [title, "", *markdown_table(header, rows), "",
             f"sentences/s batching on / off: **{summary['ratio_on_off']}**", ""]
    lines += [f"- {'PASS' if c['pass'] else 'FAIL'}: {c['target']} ({c['detail']})"
              for c in summary["checks"]]
    return "\n".join(lines) + "\n"


def errors_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in errors.items()) or "0"


def read_sources(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=SERVE_MODEL, help="model directory")
    ap.add_argument("--sources", type=Path, default=SHARED / "multi30k" / "test2016.en",
                    help="source lines to send (default: the Multi30k test2016.en)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved on/off pairs")
    ap.add_argument("--threads", type=int, default=0,
                    help="the server's torch threads (0: its default, one per core)")
    ap.add_argument("--precision", default=None,
                    help="the server's decode precision (default: the model's)")
    ap.add_argument("--beam", type=int, default=None, help="beam size (default: the model's)")
    ap.add_argument("--port", type=int, default=0, help="server port (0: a free one per run)")
    ap.add_argument("--request-timeout", type=float, default=60.0, help="client timeout (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "results")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if not args.model.is_dir():
        print(f"skipped: no model at {args.model}; train one (from {ROOT}) with:\n"
              f"  {SERVE_MODEL_HINT}")
        return
    if not args.sources.is_file():
        print(f"skipped: {args.sources} not found (set XINDA_SHARED_DATA or give --sources)")
        return
    sources = read_sources(args.sources)
    runs = [one_run(name, r, args.model, sources, args) for name, r in run_order(args.repeats)]
    meds = {name: medians(runs, name) for name in ("on", "off")}
    off = meds["off"]["sentences_per_s"]
    ratio = rounded(meds["on"]["sentences_per_s"] / off) if off else None
    summary = {"model": str(args.model), "sources": str(args.sources),
               "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               "cpus": os.cpu_count(), "medians": meds, "ratio_on_off": ratio,
               "checks": checks(runs, ratio)}
    markdown = report(runs, summary, args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "serve_load.json").write_text(json.dumps({**summary, "runs": runs},
                                                             indent=1) + "\n")
    (args.out_dir / "serve_load.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
