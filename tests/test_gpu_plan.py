"""The prepared GPU plan (gpu/run.sh) runs end to end on this CPU with tiny sizes, keeps every result as it comes,
and its caps fit the device time a GPU session is lent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "gpu" / "run.sh"
STEPS = ["speed", "generate-compiled", "profile", "shapes-2048", "shapes-2048-dot", "shapes-65536", "tests-first",
         "tests-rest"]  # fmt: skip
START_SECONDS, LENT_SECONDS = 120, 11 * 60  # a machine's start (1-2 min); the plan's share of the 15 lent minutes


def test_the_caps_with_the_machines_start_fit_eleven_minutes() -> None:
    caps = [int(seconds) for seconds in re.findall(r"^\s*(?:\S+=\S+ )?step (\d+) ", RUN.read_text(), re.M)]
    assert len(caps) == len(STEPS)
    stage_and_rebuild = 30
    assert START_SECONDS + stage_and_rebuild + sum(caps) <= LENT_SECONDS, sum(caps)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-plan")
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(RUN), "plan", "--dry-run"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_every_step_runs_within_its_cap_and_is_archived(dry_run: Path) -> None:
    summary = (dry_run / "summary.txt").read_text()
    for name in STEPS:
        assert re.search(rf"^== {name}: exit 0 in", summary, re.M), summary
    with tarfile.open(dry_run / "results.tgz") as archive:
        names = set(archive.getnames())
    assert {f"{name}.log" for name in STEPS} <= names
    assert {"shapes-2048.json", "shapes-2048-dot.json", "shapes-65536.json"} <= names


def test_the_plan_checks_exactness_first_then_times_every_drafting(dry_run: Path) -> None:
    lines = [json.loads(line) for line in (dry_run / "plan.jsonl").read_text().splitlines()]
    runs = [line for line in lines if line["step"] in ("exact", "speed")]
    assert [line["step"] for line in runs[:8]] == ["exact"] * 8  # exactness before any timing
    assert all(line["equal_to_plain"] for line in runs), [line for line in runs if not line["equal_to_plain"]]
    timed = {(line["sampling"], line["drafting"], line["tree"]) for line in runs if line["step"] == "speed"}
    for sampling in ("greedy", "paper"):
        for drafting in ("plain", "auto", "pass", "verify"):
            assert (sampling, drafting, "1,3,3,3") in timed
        for drafting in ("pass", "verify"):
            assert (sampling, drafting, "3,3,3,3") in timed
    assert any(line["step"] == "generate_compiled" and line["ms_per_token"] > 0 for line in lines)
    assert {line["drafting"] for line in lines if line["step"] == "profile"} == {"plain", "pass", "verify"}


def test_the_stage_call_notes_a_missing_half(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    command = ["bash", str(RUN), "stage", "--dry-run"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0
    assert (tmp_path / "env.txt").exists()
    if not (ROOT / ".gpu" / "part1").exists():
        assert "no .gpu/part1 carried" in (tmp_path / "summary.txt").read_text()
