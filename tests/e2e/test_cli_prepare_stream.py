"""``xinda prepare --workers N`` through the real command line: the same arrays as one
process, and a misaligned corpus found while streaming small chunks is one error line."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_corpus(folder: Path, n: int, tgt_n: int | None = None) -> str:
    words = ["one", "two", "three", "four", "five", "six", "seven"]
    src = [f"{words[i % 7]} {words[i // 7 % 7]} {i}" for i in range(n)]
    tgt = [f"{i} {words[i // 7 % 7].upper()} {words[i % 7].upper()}" for i in range(n)]
    (folder / "corpus.en").write_text("".join(f"{x}\n" for x in src), encoding="utf-8")
    (folder / "corpus.de").write_text("".join(f"{x}\n" for x in tgt[:tgt_n]), encoding="utf-8")
    return str(folder / "corpus")


def write_config(folder: Path, train: str) -> Path:
    path = folder / "config.yaml"
    data = {"train": train, "out_dir": str(folder / "data-bin"), "vocab_size": 64,
            "chunk_size": 16}
    path.write_text(yaml.safe_dump({"data": data}), encoding="utf-8")
    return path


def test_workers_give_the_arrays_of_one_process(xinda, tmp_path):
    train = write_corpus(tmp_path, 150)
    config = write_config(tmp_path, train)
    files = {}
    for workers in (1, 2):
        out = tmp_path / f"bin{workers}"
        result = xinda("prepare", config, "--workers", workers, "--set", f"data.out_dir={out}")
        assert f"prepared {out}: train 150" in result.stdout
        files[workers] = {p.name: p.read_bytes() for p in sorted(out.iterdir())
                          if p.name != "manifest.json"}
        assert f'"workers": {workers}' in (out / "manifest.json").read_text(encoding="utf-8")
    assert files[1] == files[2] and "train.src.ids.npy" in files[1]


def test_misaligned_corpus_while_streaming(xinda, one_line_error, tmp_path):
    train = write_corpus(tmp_path, 150, tgt_n=70)
    config = write_config(tmp_path, train)
    last = one_line_error(xinda("prepare", config, "--workers", 2, ok=False),
                          f"{train}.de:70: ends after 70 lines but {train}.en has more")
    assert last
    assert not (tmp_path / "data-bin").exists()


def test_ctrl_c_with_workers_ends_at_once_without_worker_tracebacks(xinda_popen, tmp_path):
    """Ctrl-C reaches the whole process group, workers too. Before: each worker printed a
    KeyboardInterrupt traceback, and a worker interrupted while sending its result kept the
    queue's lock, so the parent hung in Pool.terminate."""
    import os
    import signal
    import subprocess
    import time

    config = write_config(tmp_path, write_corpus(tmp_path, 60_000))
    proc = xinda_popen("prepare", config, "--workers", 2, start_new_session=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # (as in a terminal: the test process may have inherited SIGINT ignored)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "data-bin").glob(".staging-*/.spool-*/*")):  # pass 1 running
        assert proc.poll() is None and time.monotonic() < deadline, "prepare did not start"
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "xinda: interrupted"
    assert not (tmp_path / "data-bin").exists()  # made by this run, and nothing in it


def test_sigterm_removes_the_staging_folder_like_ctrl_c(xinda_popen, tmp_path):
    """Before: kill / timeout left out_dir/.staging-*/.spool-*/train.pkl (the whole
    preprocessed corpus) behind for good."""
    import signal
    import subprocess
    import time

    config = write_config(tmp_path, write_corpus(tmp_path, 60_000))
    proc = xinda_popen("prepare", config, "--workers", 2, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "data-bin").glob(".staging-*/.spool-*/*")):  # pass 1 running
        assert proc.poll() is None and time.monotonic() < deadline, "prepare did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the parent only, as kill PID does
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "xinda: interrupted"
    assert not (tmp_path / "data-bin").exists()  # made by this run, and nothing left in it
