"""The real ``xinda serve`` subprocess on a free 127.0.0.1 port: it comes up (bounded wait for
/health), answers concurrent requests, and on SIGTERM lets the request in flight finish before
it exits. Plus the start-up refusals, each one line on stderr. Every loop here is bounded."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from subprocesses import free_port, subprocess_env, xinda_command

STARTUP_S = 120  # imports torch and loads the model on a busy machine
REQUEST_S = 60
LINES = ["one", "two hundred", "three thousand", "forty-two", "seven", "ninety nine"]


def call(url: str, body: dict | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_S) as response:
            return response.status, response.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8")


def in_flight(base: str) -> float:
    """Requests being handled, besides this one."""
    _, text = call(base + "metrics")
    return float(re.search(r"^xinda_requests_in_flight (\S+)$", text, re.MULTILINE)[1]) - 1


@pytest.fixture
def server(served_model_dir, tmp_path):
    """``xinda serve`` with a long batching wait (a request stays in flight ~2 s) -> (base URL,
    process, log path)."""
    port, log_path = free_port(), tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*xinda_command(), "serve", str(served_model_dir), "--port",
                                 str(port), "--max-wait-ms", "2000", "--threads", "1"],
                                stdout=log, stderr=subprocess.STDOUT, env=subprocess_env())
    base = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + STARTUP_S
        while not healthy(base):
            assert proc.poll() is None, f"exited with {proc.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"not up after {STARTUP_S} s:\n" \
                f"{log_path.read_text()}"
            time.sleep(0.25)
        yield base, proc, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def healthy(base: str) -> bool:
    try:
        return json.loads(call(base + "health")[1])["status"] == "ok"
    except (OSError, ValueError, KeyError):
        return False


def test_concurrent_requests_then_sigterm_lets_the_request_in_flight_finish(server):
    base, proc, log_path = server
    with ThreadPoolExecutor(len(LINES)) as pool:
        answers = list(pool.map(lambda line: call(base + "v1/translate", {"text": line}),
                                LINES))
    assert [status for status, _ in answers] == [200] * len(LINES)
    assert [json.loads(body)["translations"][0]["source"] for _, body in answers] == LINES
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call, base + "v1/translate", {"text": ["one", "two"]})
        for _ in range(200):  # bounded: until the server holds the request
            if in_flight(base) >= 1:
                break
            time.sleep(0.05)
        assert not pending.done()
        proc.send_signal(signal.SIGTERM)
        status, body = pending.result(timeout=REQUEST_S)
    assert status == 200, body
    assert len(json.loads(body)["translations"]) == 2
    returncode = proc.wait(timeout=REQUEST_S)
    assert returncode in (0, -signal.SIGTERM), log_path.read_text()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--host", "0.0.0.0"], "--api-key"),
    (["--port", "-1"], "port"),
    (["--max-wait-ms", "inf"], "max_wait_ms"),
    (["--max-wait-ms", "1000", "--timeout", "1"], "max_wait_ms"),
    (["--timeout", "inf"], "timeout_s"),
    (["--max-work", "0"], "max_work"),
    (["--threads", "-1"], "--threads"),
    (["--device", "bogus"], "--device bogus"),
    pytest.param(["--device", "cuda"], "--device cuda", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA is available here")),
])
def test_refusals_at_start_are_one_line(served_model_dir, args, fragment):
    proc = subprocess.run([*xinda_command(), "serve", str(served_model_dir), *args],
                          capture_output=True, text=True, timeout=120,
                          env=subprocess_env(XINDA_API_KEY=""), check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xinda: error:"), proc.stderr
    assert fragment in lines[0]


def test_a_port_in_use_is_one_line(served_model_dir):
    """Before: uvicorn's start-up log, its bind error and exit code 3 (found by review)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = subprocess.run([*xinda_command(), "serve", str(served_model_dir), "--port",
                               str(port)], capture_output=True, text=True, timeout=120,
                              env=subprocess_env(), check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (f"xinda: error: 127.0.0.1:{port}: cannot listen: "
                                   "Address already in use")


def test_a_missing_model_directory_is_one_line(tmp_path):
    proc = subprocess.run([*xinda_command(), "serve", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, env=subprocess_env(),
                          check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("xinda: error:")
