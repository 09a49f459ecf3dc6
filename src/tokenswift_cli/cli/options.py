"""Shared command-line options as `Annotated` aliases (as the `hf` CLI does), and their parsers.

Defaults come from the config dataclasses, so a flag left out means the library's default. Nothing
here imports torch: `tokenswift --help` stays instant.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer

from tokenswift_cli.config import AutoWindow, ConfigError, ContextWindow, DraftConfig, SamplingConfig
from tokenswift_cli.sampling.defaults import automatic_window

_SAMPLING = SamplingConfig()
_DRAFT = DraftConfig()
_TOKENS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kKmM]?)")
_MULTIPLIERS = {"": 1, "k": 1_000, "m": 1_000_000}


def parse_tokens(text: str) -> int:
    """A token count: `20000`, `2K`, `1.5k`, `100k`, `1m`. Raises ConfigError on anything else."""
    match = _TOKENS.fullmatch(text.strip().replace("_", ""))
    if match is None:
        raise ConfigError(f"bad token count {text!r}: use a number such as 20000, 2k, 1.5k or 100k")
    try:
        value = Decimal(match.group(1)) * _MULTIPLIERS[match.group(2).lower()]
    except InvalidOperation:
        raise ConfigError(f"bad token count {text!r}") from None
    if value != value.to_integral_value():
        raise ConfigError(f"bad token count {text!r}: it is not a whole number of tokens")
    if value < 1:
        raise ConfigError(f"bad token count {text!r}: it must be at least 1")
    return int(value)


def parse_tree(text: str) -> tuple[int, ...]:
    """A tree template `1,3,3,3` (the width of each level)."""
    try:
        widths = tuple(int(part) for part in text.replace(" ", "").split(","))
    except ValueError:
        raise ConfigError(f"bad tree {text!r}: use widths separated by commas, e.g. 1,3,3,3") from None
    return widths


def parse_window(text: str, sinks: int, model: str = "default") -> ContextWindow | AutoWindow | None:
    """`--context-window`: "auto" (the model's measured default), "none" or a size (sinks not included)."""
    choice = text.strip().lower()
    if choice in ("auto", "none"):
        return None if choice == "none" else automatic_window(model, sinks)
    return ContextWindow(size=parse_tokens(text), sinks=sinks)


def off_if_zero(value: int | None) -> int | None:
    """0 on the command line turns a feature off; the configs spell off as None."""
    return None if value == 0 else value


_SAMPLE = "Sampling"
_ACCEL = "Acceleration"
_MODEL = "Model"
_RUN = "Run and output"

# Inputs
PrefixOpt = Annotated[
    str,
    typer.Option("--prefix", "-p", help="Text file the model continues; - reads standard input.", show_default=False),
]
TokensOpt = Annotated[
    str, typer.Option("--tokens", "-n", help="Tokens to write: 20000, 2k, 1.5k, 100k.", show_default=False)
]
RaiseTokensOpt = Annotated[
    str | None,
    typer.Option("--tokens", "-n", help="Raise the run's target to this many tokens (e.g. 8k).", show_default=False),
]

# Model
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="'default' (embedded SmolLM2-135M-Instruct), a model folder, a .gguf file or a hub id.",
        rich_help_panel=_MODEL,
    ),
]  # fmt: skip
HeadsOpt = Annotated[
    str,
    typer.Option(
        "--heads", help="Draft heads: a .safetensors file, 'none', or 'default' (the shipped heads of the model).",
        rich_help_panel=_MODEL,
    ),
]  # fmt: skip
DTypeOpt = Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16 or float16.", rich_help_panel=_MODEL)]
WeightsOpt = Annotated[
    str,
    typer.Option(
        "--weights",
        help="auto (4-bit on a CPU when the model already is, e.g. the embedded one), dense or int4 "
        "(the decoder's linear layers on 4-bit weights, CPU).",
        rich_help_panel=_MODEL,
    ),
]
RopeScalingOpt = Annotated[
    str,
    typer.Option(
        "--rope-scaling", help="auto (YaRN when the run outgrows the trained length), yarn or none.",
        rich_help_panel=_MODEL,
    ),
]  # fmt: skip
ContextWindowOpt = Annotated[
    str,
    typer.Option(
        "--context-window",
        help="auto (once a run outgrows the model's trained length: the last 4,092 tokens + --sinks for the "
        "embedded model, the trained length for others), none (full context, YaRN), or a size such as 4k.",
        rich_help_panel=_MODEL,
    ),
]
KVCacheOpt = Annotated[
    str,
    typer.Option(
        "--kv-cache",
        help="How the KV cache stores keys and values: auto (float16 where the native CPU decoder reads it: "
        "half the memory and time per step at long context), model (as the model computes) or float16.",
        rich_help_panel=_MODEL,
    ),
]
SinksOpt = Annotated[
    int, typer.Option("--sinks", min=1, help="First tokens every token attends to under a context window.",
                      rich_help_panel=_MODEL),
]  # fmt: skip
RopeFactorOpt = Annotated[
    float | None,
    typer.Option("--rope-factor", help="YaRN factor (default: sized to the run).", rich_help_panel=_MODEL),
]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto (shard over GPUs).", rich_help_panel=_MODEL)
]

# Sampling
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "-t",
        help="0 = greedy. Unset sampling flags take the model's measured defaults.",
        rich_help_panel=_SAMPLE,
    ),
]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling mass.", rich_help_panel=_SAMPLE)]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Keep the k likeliest tokens.", rich_help_panel=_SAMPLE)]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help="Min-p filter; 0 = off.", rich_help_panel=_SAMPLE)]
EtaOpt = Annotated[float | None, typer.Option("--eta", help="Eta sampling epsilon.", rich_help_panel=_SAMPLE)]
PenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--penalty", help="Repetition penalty over the last --penalty-window tokens; 1 = off.", rich_help_panel=_SAMPLE
    ),
]
PenaltyWindowOpt = Annotated[
    int | None, typer.Option("--penalty-window", help="Tokens the penalty looks back over.", rich_help_panel=_SAMPLE)
]
DryOpt = Annotated[
    float | None,
    typer.Option(
        "--dry",
        help="DRY multiplier: penalise tokens that extend a repeat of 2+ earlier tokens; 0 = off.",
        rich_help_panel=_SAMPLE,
    ),
]
DryBaseOpt = Annotated[
    float | None,
    typer.Option(
        "--dry-base",
        help="DRY growth: a repeat of n tokens loses --dry x base^(n - 2); >= 1.",
        rich_help_panel=_SAMPLE,
    ),
]
ScriptsOpt = Annotated[
    str | None,
    typer.Option(
        "--scripts",
        help="Scripts the text may use: auto (the prefix's), any, or names such as latin,greek "
        "(latin greek cyrillic armenian hebrew arabic devanagari thai georgian hangul cjk emoji).",
        rich_help_panel=_SAMPLE,
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", help="Seed of the position-keyed random stream.", rich_help_panel=_SAMPLE)
]

# Acceleration
ModeOpt = Annotated[
    str, typer.Option("--mode", help="tokenswift, or plain (the baseline, same sampler).", rich_help_panel=_ACCEL)
]
TreeOpt = Annotated[
    str, typer.Option("--tree", help="Tree template: width of each draft level.", rich_help_panel=_ACCEL)
]
NGramTopKOpt = Annotated[
    int, typer.Option("--ngram-top-k", help="N-gram candidates per level-1 token; 0 = off.", rich_help_panel=_ACCEL)
]
DraftOpt = Annotated[
    str,
    typer.Option(
        "--draft", help="auto (per step, the plan whose measured acceptance pays for its cost), pass (the paper's "
        "draft forward), verify (drafts from the verification pass), ngram (the n-gram table alone) or lookup "
        "(what followed the latest earlier match of the text's end).",
        rich_help_panel=_ACCEL,
    ),
]  # fmt: skip
LookupOpt = Annotated[
    int,
    typer.Option(
        "--lookup", min=0, help="Longest lookup draft (tokens that followed an earlier match); 0 = off.",
        rich_help_panel=_ACCEL,
    ),
]  # fmt: skip
PartialBudgetOpt = Annotated[
    int,
    typer.Option(
        "--partial-budget", help="KV positions the draft pass attends to; 0 = the full cache.", rich_help_panel=_ACCEL
    ),
]

# Run and output
RunArg = Annotated[str, typer.Argument(help="A run: run-042, 42, or the path of a run folder.", show_default=False)]
OutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="Also write the text to this file.", rich_help_panel=_RUN, show_default=False),
]
CheckpointEveryOpt = Annotated[
    int, typer.Option("--checkpoint-every", help="Checkpoint every this many tokens.", rich_help_panel=_RUN, min=1)
]
RunsDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--runs-dir", help="Folder of run directories (default: $TOKENSWIFT_HOME/runs).", rich_help_panel=_RUN,
        show_default=False,
    ),
]  # fmt: skip
StopAtEosOpt = Annotated[
    bool, typer.Option("--stop-at-eos", help="Stop at the model's end-of-sequence token.", rich_help_panel=_RUN)
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="No panel and no log lines on stderr.", rich_help_panel=_RUN)
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads", min=1, help="CPU threads for torch (default: torch's choice). Does not change the text.",
        rich_help_panel=_RUN, show_default=False,
    ),
]  # fmt: skip
JsonOpt = Annotated[bool, typer.Option("--json", help="Print settings and statistics as JSON.")]

DEFAULT_CHECKPOINT_EVERY = 512
SAMPLING_DEFAULTS = _SAMPLING
DEFAULT_TREE = ",".join(str(w) for w in _DRAFT.tree)
DEFAULT_NGRAM_TOP_K = _DRAFT.ngram_top_k or 0
DEFAULT_PARTIAL_BUDGET = _DRAFT.partial_budget or 0
DEFAULT_LOOKUP = _DRAFT.lookup_length or 0
