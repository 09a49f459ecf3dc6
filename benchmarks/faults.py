"""Fault injection for `tokenswift` runs: a run stopped at random moments, resumed (the resumes
stopped too) until done, its text compared with an uninterrupted run's. Used by
`tests/test_faults.py` and `benchmarks/fault_sweep.py`.

Each command runs in its own process, forked from a launcher that imported the package once (a new
interpreter spends seconds importing torch before anything can be killed; `Launcher(cold=True)`
starts one all the same). A stop is timed at random, or comes as soon as the run's settings appear
(the prefill) or a checkpoint file is being written. Its phase is read from the run folder just
before the signal: loading (no settings yet, or a resume still loading and restoring), prefill
(settings, no checkpoint), checkpoint (a checkpoint's temporary file exists), generation. A
stopped run must list as resumable (or, stopped while being created, as incomplete: it is removed
and written again).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenswift_cli.runs import store

PHASES = ("loading", "prefill", "checkpoint", "generation")
SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT, "term": signal.SIGTERM}
STOPS = {signal.SIGINT, signal.SIGTERM}


# ---- processes ----


class Child:
    """One `tokenswift` process: its pid, and its exit code (-N: killed by signal N; None: hung, killed)."""

    def __init__(self, pid: int, launcher: Launcher | None = None, popen: subprocess.Popen[bytes] | None = None):
        self.pid, self._launcher, self._popen = pid, launcher, popen

    def wait(self, timeout: float) -> int | None:
        if self._popen is not None:
            try:
                return self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
                return None
        assert self._launcher is not None
        return self._launcher.wait(self.pid, timeout)

    def ended(self) -> bool:
        try:  # a zombie ('Z') has ended; its parent has not reaped it yet
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return True


class Launcher:
    """Starts `tokenswift` commands as forks of a process that imported the package (or, cold, fresh)."""

    def __init__(self, *, cold: bool = False) -> None:
        self._server: subprocess.Popen[str] | None = None
        self._late = ""  # set when an answer did not come in time: a later one would answer the wrong question
        if not cold:
            argv = [sys.executable, str(Path(__file__).resolve())]
            self._server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            ready = self._reply(600.0)
            if ready != {"ready": True}:
                raise RuntimeError(f"the launcher did not start in 600 s (it answered {ready!r})")

    def start(self, args: list[str], *, out: Path, err: Path) -> Child:
        if self._server is None:
            with out.open("wb") as stdout, err.open("wb") as stderr:
                command = [sys.executable, "-m", "tokenswift_cli", *args]
                popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
            return Child(popen.pid, popen=popen)
        self._send({"op": "run", "args": args, "out": str(out), "err": str(err)})
        started = self._reply(600.0)
        if started is None:
            raise RuntimeError(f"the launcher did not fork `tokenswift {' '.join(args)}` in 600 s")
        return Child(started["pid"], launcher=self)

    def wait(self, pid: int, timeout: float) -> int | None:
        self._send({"op": "wait", "pid": pid})
        reply = self._reply(timeout)
        if reply is None:  # hung: kill it, then the launcher reaps it and answers
            os.kill(pid, signal.SIGKILL)
            self._late = ""
            if self._reply(600.0) is None:
                raise RuntimeError(f"the launcher did not reap {pid} in 600 s after SIGKILL")
            return None
        return int(reply["status"])

    def close(self) -> None:
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            try:
                self._server.wait(600)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()

    def _send(self, request: dict[str, Any]) -> None:
        assert self._server is not None and self._server.stdin is not None
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()

    def _reply(self, timeout: float) -> Any:
        """The launcher's next answer, or None after `timeout` seconds (then the launcher is out of step)."""
        assert self._server is not None and self._server.stdout is not None
        if self._late:
            raise RuntimeError(f"the launcher is out of step: {self._late}")
        if not select.select([self._server.stdout], [], [], timeout)[0]:
            self._late = f"no answer in {timeout:.0f} s"
            return None
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError(f"the launcher died (exit {self._server.poll()})")
        return json.loads(line)


def serve() -> None:
    """The launcher: import once, then fork one process per `run` request and reap it on `wait`."""
    import transformers

    import tokenswift_cli.cli.app
    import tokenswift_cli.runs.runner  # noqa: F401  (torch, the engine: what every command needs)

    transformers.AutoModelForCausalLM  # noqa: B018  (its lazy import)
    with contextlib.suppress(Exception):  # a table every model load builds first (~1 s), pure Python
        transformers.conversion_mapping.get_checkpoint_conversion_mapping("llama")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "run":
            # A stop may come as soon as the pid is known: the child holds it until its handlers are in place.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
            pid = os.fork()
            if pid == 0:
                _child(request)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
            reply = {"pid": pid}
        else:
            reply = {"status": os.waitstatus_to_exitcode(os.waitpid(request["pid"], 0)[1])}
        print(json.dumps(reply), flush=True)


def _child(request: dict[str, Any]) -> None:
    """Run `tokenswift ARGS` in this forked process, as `python -m tokenswift_cli ARGS` would; never returns."""
    code = 1
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # a stop sent meanwhile arrives here, inside the try
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = ["tokenswift", *request["args"]]
        from tokenswift_cli.cli.app import main

        main()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
    finally:
        # A late Ctrl-C must not return this fork into the launcher's loop: exit, whatever is raised meanwhile.
        while True:
            try:
                signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(OSError, ValueError):
                        stream.flush()
                os._exit(code)
            except BaseException:  # the signal's KeyboardInterrupt: go round and exit
                pass


# ---- one trial: a run stopped, resumed, stopped... until done ----


@dataclass(frozen=True)
class Sweep:
    """What every trial runs (`args`: the write command's arguments) and how it is stopped."""

    args: tuple[str, ...]
    reference: bytes
    seconds: float  # an uninterrupted write's duration: kills are timed within it
    sig: str = "kill"
    max_kills: int = 4
    timeout: float = 600.0  # a safety net for a hung process, not a measure: any loaded machine is far inside it
    min_kills: int = 0  # a trial whose runs all ended before their stops starts over, this many times at most:
    attempts: int = 1  # with min_kills 1 and enough attempts, every trial stops a run (tests/test_faults.py)


@dataclass(frozen=True)
class Kill:
    process: str  # write or resume
    trigger: str  # time, settings or checkpoint
    delay: float  # seconds after the start before the trigger is watched for
    phase: str  # what the run folder showed just before the signal
    exit: int | None


@dataclass
class Trial:
    index: int
    seed: int
    kills: list[Kill] = field(default_factory=list)
    resumes: int = 0
    identical: bool = False
    failure: str | None = None


def latest_run(runs_dir: Path) -> Path | None:
    names = sorted(p.name for p in runs_dir.glob("run-*") if p.is_dir()) if runs_dir.is_dir() else []
    return runs_dir / names[-1] if names else None


def _writing_checkpoint(run: Path) -> bool:
    folder = run / "checkpoint"
    return folder.is_dir() and any(name.endswith(".tmp") for name in os.listdir(folder))


def phase_of(runs_dir: Path, pid: int, *, resuming: bool) -> str:
    """The phase of process `pid`, from its run folder (see the module's docstring)."""
    run = latest_run(runs_dir)
    if run is None or not (run / store.SETTINGS).is_file():
        return "loading"
    try:  # a resume records its pid once it has loaded the model and the checkpoint
        started = not resuming or json.loads((run / store.STATUS).read_text()).get("pid") == pid
    except (OSError, ValueError):
        started = False
    if not started:
        return "loading"
    if _writing_checkpoint(run):
        return "checkpoint"
    return "generation" if (run / "checkpoint" / "manifest.json").exists() else "prefill"


def _watch(child: Child, runs_dir: Path, trigger: str, delay: float, deadline: float) -> bool:
    """Wait `delay` seconds, then for the trigger; False if the process ended first."""
    start = time.monotonic()
    while not child.ended() and time.monotonic() < deadline:
        if time.monotonic() - start >= delay:
            run = latest_run(runs_dir)
            if (
                trigger == "time"
                or run is not None
                and ((run / store.SETTINGS).is_file() if trigger == "settings" else _writing_checkpoint(run))
            ):
                return True
        time.sleep(0.001)
    return False


def _command(sweep: Sweep, trial: Trial, runs_dir: Path) -> list[str]:
    """What the user would run next: write, resume, or remove a run stopped while being created."""
    run = latest_run(runs_dir)
    if run is not None and store.run_state(run) == "incomplete":
        return ["runs", "rm", run.name, "--yes", "--runs-dir", str(runs_dir)]
    if run is not None:
        trial.resumes += 1
        return ["resume", run.name, "--runs-dir", str(runs_dir), "--threads", "1", "-q"]
    return ["write", *sweep.args, "--runs-dir", str(runs_dir)]


def _step(launcher: Launcher, sweep: Sweep, trial: Trial, rng: random.Random, runs_dir: Path) -> bool:
    """Run the next command of the trial, maybe stopping it; True when the run is done."""
    done = latest_run(runs_dir)
    if done is not None and store.run_state(done) == "done":
        return True  # stopped as it ended: the run is complete, and `resume` rightly refuses a complete run
    args = _command(sweep, trial, runs_dir)
    out, err = runs_dir.parent / f"{runs_dir.name}.out", runs_dir.parent / f"{runs_dir.name}.err"
    kill = args[0] != "runs" and len(trial.kills) < sweep.max_kills and rng.random() < 0.85
    trigger = rng.choice(("time", "settings", "checkpoint") if args[0] == "write" else ("time", "checkpoint"))
    delay, second = rng.uniform(0.0, sweep.seconds), sweep.sig == "int" and rng.random() < 0.3  # Ctrl-C twice
    child, phase = launcher.start(args, out=out, err=err), None
    if kill and _watch(child, runs_dir, trigger, delay, time.monotonic() + sweep.timeout):
        phase = phase_of(runs_dir, child.pid, resuming=args[0] == "resume")
        os.kill(child.pid, SIGNALS[sweep.sig])
        if second:
            time.sleep(rng.uniform(0.0, 0.2))
            if not child.ended():
                os.kill(child.pid, SIGNALS[sweep.sig])
    code, stderr = child.wait(sweep.timeout), err.read_text(errors="replace")
    if phase is not None:
        trial.kills.append(Kill(args[0], trigger, round(delay, 3), phase, code))
    if code is None:
        raise AssertionError(f"{args[0]} hung ({sweep.timeout:.0f} s)")
    # A traceback is a bug, but for Ctrl-C's KeyboardInterrupt where no handler can take it (a fresh
    # interpreter's imports, a finaliser): Python prints those.
    if "internal error" in stderr or "Traceback" in stderr and "KeyboardInterrupt" not in stderr:
        raise AssertionError(f"{args[0]} (exit {code}): {stderr.strip()[-2000:]}")
    if code != 0 and phase is None:
        raise AssertionError(f"{args[0]} failed (exit {code}): {stderr.strip()[-2000:]}")
    stopped = latest_run(runs_dir)
    info = store.run_info(stopped) if code != 0 and stopped is not None else None
    if info is not None and (info.state == "running" or info.state in ("interrupted", "failed") and not info.resumable):
        raise AssertionError(f"{info.id} is {info.state}, not resumable, after the {phase} kill{lock_holders(stopped)}")
    return code == 0 and args[0] != "runs"


def lock_holders(run: Path) -> str:
    """Who holds the run's lock, from /proc/locks (Linux): the process and its command line."""
    try:
        inode = (run / "lock").stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    held = []
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[5].endswith(f":{inode}"):
            try:
                command = Path(f"/proc/{fields[4]}/cmdline").read_text().replace("\0", " ").strip()
            except OSError:
                command = "gone"
            held.append(f"pid {fields[4]} ({command[:200]})")
    return f"; held by {', '.join(held)}" if held else "; no holder in /proc/locks by now"


def run_trial(launcher: Launcher, sweep: Sweep, *, index: int, seed: int, root: Path) -> Trial:
    """One run, stopped and resumed until done (or failed); its text compared with the reference.

    A stop that comes after its run ended stops nothing (a loaded machine can be that slow to watch);
    while fewer than `min_kills` stops landed, the trial writes a new run, `attempts` runs at most."""
    trial, rng = Trial(index, seed), random.Random(seed)
    try:
        for attempt in range(max(1, sweep.attempts)):
            runs_dir = root / f"trial-{index:04d}" / f"attempt-{attempt}"
            runs_dir.parent.mkdir(parents=True, exist_ok=True)
            for _ in range(sweep.max_kills + 4):
                if _step(launcher, sweep, trial, rng, runs_dir):
                    break
            else:
                raise AssertionError(f"the run did not finish (attempt {attempt})")
            run = latest_run(runs_dir)
            if run is None or store.run_state(run) != "done":
                raise AssertionError(f"{run} is not done (attempt {attempt})")
            trial.identical = (run / store.TEXT).read_bytes() == sweep.reference
            if not trial.identical:
                raise AssertionError(f"the text of {run} differs from the uninterrupted run's")
            if len(trial.kills) >= sweep.min_kills:
                break
        else:
            raise AssertionError(f"{sweep.attempts} runs ended before any of their stops came")
    except AssertionError as error:
        trial.failure = str(error)
    return trial


# ---- the sweep ----


def reference(launcher: Launcher, args: tuple[str, ...], root: Path) -> tuple[bytes, float]:
    """The text of an uninterrupted write, and how long its process took."""
    runs_dir = root / "reference"
    start = time.monotonic()
    child = launcher.start(["write", *args, "--runs-dir", str(runs_dir)], out=root / "ref.out", err=root / "ref.err")
    code = child.wait(1800.0)
    if code != 0:
        raise RuntimeError(f"the uninterrupted write failed ({code}): {(root / 'ref.err').read_text()[-2000:]}")
    return (runs_dir / "run-001" / store.TEXT).read_bytes(), time.monotonic() - start


def summary(trials: list[Trial]) -> dict[str, Any]:
    phases = Counter(kill.phase for trial in trials for kill in trial.kills)
    return {
        "trials": len(trials),
        "kills": sum(len(trial.kills) for trial in trials),
        **{f"kills_{phase}": phases[phase] for phase in PHASES},
        "resumes": sum(trial.resumes for trial in trials),
        "identical": sum(trial.identical for trial in trials),
        "failures": sum(trial.failure is not None for trial in trials),
    }


def sweep(launcher: Launcher, config: Sweep, *, trials: int, seed: int, root: Path) -> list[Trial]:
    """`trials` trials (trial i uses seed `seed + i`); a failure is printed with its seed at once."""
    done = []
    for index in range(trials):
        trial = run_trial(launcher, config, index=index, seed=seed + index, root=root)
        if trial.failure is not None:
            kills = "; ".join(
                f"{k.process} {k.trigger} +{k.delay:.3f} s ({k.phase}, exit {k.exit})" for k in trial.kills
            )
            print(f"trial {index} (--seed {trial.seed}) failed: {trial.failure} [kills: {kills}]", file=sys.stderr)
        done.append(trial)
    return done


if __name__ == "__main__":
    serve()
