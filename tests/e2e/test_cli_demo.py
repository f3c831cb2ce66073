"""``xinda demo`` end to end, with fewer updates than its default 800 and no time cap, so it is
quick and its result does not depend on the machine's speed: the model must really learn the
task."""

from __future__ import annotations

import re

DEMO_UPDATES = 250  # measured: 62 % exact match on the 300 held-out numbers (1 thread, bf16)


def test_demo_translates_held_out_numbers(xinda, tmp_path):
    proc = xinda("demo", "--workdir", "moved", "--set", "train.max_seconds=0",
                 "--set", f"train.max_steps={DEMO_UPDATES}", "--set", "train.threads=1",
                 cwd=tmp_path, timeout=900)
    assert f"train transformer-tiny for {DEMO_UPDATES} updates" in proc.stdout
    exact = float(re.search(r"test: exact match ([\d.]+)%", proc.stdout)[1])
    assert exact >= 40.0, proc.stdout  # an untrained model gets 0 %
    examples = re.findall(r"-> (\S*) +\((ok|expected \d+)\)", proc.stdout)
    assert len(examples) == 5 and any(verdict == "ok" for _, verdict in examples), proc.stdout
    # --workdir moved every path of the config (default xinda-demo/...)
    assert (tmp_path / "moved" / "model" / "config.yaml").is_file()
    assert not (tmp_path / "xinda-demo").exists()
