"""Fault sweep: `tokenswift write` runs stopped at random moments (SIGKILL, SIGINT or SIGTERM) and
resumed until done, the resumes stopped too; every final text must equal an uninterrupted run's.

    python benchmarks/fault_sweep.py --trials 200 --signal kill --json faults-kill.json          # embedded model
    python benchmarks/fault_sweep.py --trials 200 --signal kill --tiny --json faults-tiny.json   # tiny random model

Prints trials, kills by phase (loading, prefill, checkpoint, generation: see benchmarks/faults.py),
resumes, identical texts and failures; `--json` writes every trial's kills too. A failure prints its
trial's seed: `--seed S --trials 1` replays that trial's plan (the moments are random, the plan is not).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from faults import SIGNALS, Launcher, Sweep, reference, summary, sweep

from tokenswift_cli.data import DEFAULT_TEXT


def table(totals: dict[str, Any]) -> str:
    """The summary as two aligned rows: names, figures."""
    names = {k: k.removeprefix("kills_") for k in totals}
    widths = {k: max(len(names[k]), len(str(v))) for k, v in totals.items()}
    head = "  ".join(f"{names[k]:>{widths[k]}}" for k in totals)
    return head + "\n" + "  ".join(f"{v:>{widths[k]}}" for k, v in totals.items())


def _tiny(folder: Path) -> tuple[Path, str]:
    """The tests' tiny random model (tests/cli_helpers.py), and its prefix."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from cli_helpers import PREFIX, build_tiny_folder

    return build_tiny_folder(folder), PREFIX * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--signal", choices=sorted(SIGNALS), default="kill")
    parser.add_argument("--seed", type=int, default=0, help="trial i uses seed SEED + i")
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random model (else --model)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--heads", default="default")
    parser.add_argument("--tokens", type=int, default=None, help="default: 300 (tiny: 200)")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="default: 32 (tiny: 8)")
    parser.add_argument("--max-kills", type=int, default=4, help="per trial; then the run goes to its end")
    parser.add_argument("--cold", action="store_true", help="a new interpreter per command (slow)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fault-sweep-") as tmp:
        root = Path(tmp)
        model, text = _tiny(root / "tiny") if args.tiny else (args.model, DEFAULT_TEXT.read_text()[:3000])
        (root / "prefix.txt").write_text(text, encoding="utf-8")
        tokens = args.tokens or (200 if args.tiny else 300)
        every = args.checkpoint_every or (8 if args.tiny else 32)
        write: tuple[str, ...] = ("-p", str(root / "prefix.txt"), "-n", str(tokens), "-m", str(model))
        write += ("--heads", args.heads, "--checkpoint-every", str(every), "--threads", "1", "-q")
        launcher = Launcher(cold=args.cold)
        try:
            text_bytes, seconds = reference(launcher, write, root)
            config = Sweep(write, text_bytes, seconds, sig=args.signal, max_kills=args.max_kills)
            trials = sweep(launcher, config, trials=args.trials, seed=args.seed, root=root)
        finally:
            launcher.close()
    totals = summary(trials)
    print(f"signal {args.signal}, model {'tiny' if args.tiny else args.model}, {tokens} tokens, "
          f"checkpoint every {every}, uninterrupted write {seconds:.1f} s")  # fmt: skip
    print(table(totals))
    if args.json is not None:
        settings = {k: v for k, v in vars(args).items() if k != "json"} | {"tokens": tokens}
        document = {"settings": settings | {"checkpoint_every": every}, "summary": totals}
        args.json.write_text(json.dumps(document | {"trials": [asdict(t) for t in trials]}, indent=1) + "\n")
    sys.exit(1 if totals["failures"] else 0)


if __name__ == "__main__":
    main()
