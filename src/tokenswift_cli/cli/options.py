"""Shared command-line options as `Annotated` aliases (as the `hf` CLI does); their parsers are in parsing.py.

Defaults come from the config dataclasses, so a flag left out means the library's default; an unset
sampling flag shows the model defaults it stands for. Nothing here imports torch: `--help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenswift_cli.config import DraftConfig, SamplingConfig
from tokenswift_cli.sampling.defaults import EMBEDDED, PAPER

_SAMPLING = SamplingConfig()
_DRAFT = DraftConfig()


def _with_default(text: str, name: str) -> str:
    """The help of a sampling flag, with what leaving it unset means: the embedded model's measured value
    and other models' (the paper's)."""

    def shown(value: object) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, tuple):
            return ",".join(value) or "any"
        return "off" if value is None else str(value)

    embedded, others = shown(getattr(EMBEDDED, name)), shown(getattr(PAPER, name))
    default = embedded if embedded == others else f"{embedded} for the embedded model, {others} for others"
    return f"{text} Default: {default}."


_SAMPLE = "Sampling"
_ACCEL = "Acceleration"
_MODEL = "Model"
_RUN = "Run and output"

# Inputs
PrefixOpt = Annotated[
    str | None,
    typer.Option("--prefix", "-p", help="Text file the model continues; - reads standard input.", show_default=False),
]
PromptOpt = Annotated[
    str | None,
    typer.Option("--prompt", help="A request to an instruct model, through its chat template.", show_default=False),
]
PromptFileOpt = Annotated[
    str | None,
    typer.Option("--prompt-file", help="The request from a text file (- reads standard input).", show_default=False),
]
SystemOpt = Annotated[
    str | None,
    typer.Option(
        "--system", help="A system message before --prompt (default: the template's own).", show_default=False
    ),
]
StopOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--stop",
        help="End the text at the first occurrence of this string (included); repeat for several.",
        rich_help_panel=_RUN,
        show_default=False,
    ),
]
# parsing.parse_tokens: k = 1,000 and m = 1,000,000 (test_cli checks that the help says what it parses).
TOKEN_SUFFIXES = "k = 1,000, m = 1,000,000"
_TOKENS_HELP = f"Tokens to write: 20000, 2k, 1.5k, 100k or 1m ({TOKEN_SUFFIXES})."
_RAISE_HELP = f"Raise the run's target to this many tokens: 8k, 1.5m ({TOKEN_SUFFIXES})."
TokensOpt = Annotated[str, typer.Option("--tokens", "-n", help=_TOKENS_HELP, show_default=False)]
RaiseTokensOpt = Annotated[str | None, typer.Option("--tokens", "-n", help=_RAISE_HELP, show_default=False)]

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
_INT4 = "int4 (the decoder's linear layers on 4-bit weights, CPU)"
_GGUF = "gguf (a GGUF file's own blocks, read in place, CPU)"
_AUTO_WEIGHTS = "auto (a GGUF file's own blocks on a CPU; int4 for a Q4_1 file such as the embedded one)"
_WEIGHTS = f"{_AUTO_WEIGHTS}, {_GGUF}, dense (float32) or {_INT4}."
WeightsOpt = Annotated[str, typer.Option("--weights", help=_WEIGHTS, rich_help_panel=_MODEL)]
# eval's judge reads the dense weights unless told otherwise: its NLL is the model's, not a 4-bit copy's.
_JUDGE_WEIGHTS = f"dense (the judge's NLL is the full-precision model's), {_AUTO_WEIGHTS}, {_GGUF} or {_INT4}."
JudgeWeightsOpt = Annotated[str, typer.Option("--weights", help=_JUDGE_WEIGHTS, rich_help_panel=_MODEL)]
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
        help="auto (once a run outgrows the model's trained length: for the embedded model the --keep tokens "
        "and the last 4,092 tokens, fewer as --keep grows, 4,096 in all; the trained length for others), none "
        "(full context, YaRN), or a size such as 4k (the recent tokens, --keep not included).",
        rich_help_panel=_MODEL,
    ),
]
KVCacheOpt = Annotated[
    str,
    typer.Option(
        "--kv-cache",
        help="How the KV cache stores keys and values: auto (float16 where the native CPU decoder reads it: "
        "half the memory and time per step at long context), model (as the model computes), float16, or int8 "
        "(CPU: 8 bits and a scale per 32 values read by integer products, kept twice, as rows and by tiles "
        "for the kernel: faster steps, 1.1x float16's bytes; other text than float16's).",
        rich_help_panel=_MODEL,
    ),
]
KeepOpt = Annotated[
    str | None,
    typer.Option(
        "--keep", "--sinks",
        help="Under a context window, the first N tokens of the prompt every token still attends to, or "
        "'prompt' (all of it), as llama.cpp's --keep. Default: prompt with --prompt, 4 with --prefix. "
        "At most half the window; recorded with the run. (--sinks: its old name.)",
        show_default=False, rich_help_panel=_MODEL,
    ),
]  # fmt: skip
RopeFactorOpt = Annotated[
    float | None,
    typer.Option("--rope-factor", help="YaRN factor (default: sized to the run).", rich_help_panel=_MODEL),
]
_DEVICES = "cpu, cuda, cuda:N, mps or auto (shard over GPUs)."
# write's default: parsing.resolve_device picks it when the flag is left out (None).
_DEVICE_HELP = f"{_DEVICES} Default: cuda where a GPU is present, else cpu."
DeviceOpt = Annotated[str | None, typer.Option("--device", help=_DEVICE_HELP, rich_help_panel=_MODEL)]
# The commands that default to the CPU (eval, train-heads, heads eval): their [default: cpu] says so.
CpuDeviceOpt = Annotated[str, typer.Option("--device", help=_DEVICES, rich_help_panel=_MODEL)]

# Sampling
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "-t",
        help=_with_default("0 = greedy. Unset sampling flags take the model's measured defaults.", "temperature"),
        rich_help_panel=_SAMPLE,
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option("--top-p", help=_with_default("Nucleus sampling mass.", "top_p"), rich_help_panel=_SAMPLE),
]
TopKOpt = Annotated[
    int | None,
    typer.Option("--top-k", help=_with_default("Keep the k likeliest tokens.", "top_k"), rich_help_panel=_SAMPLE),
]
MinPOpt = Annotated[
    float | None,
    typer.Option("--min-p", help=_with_default("Min-p filter; 0 = off.", "min_p"), rich_help_panel=_SAMPLE),
]
EtaOpt = Annotated[
    float | None,
    typer.Option("--eta", help=_with_default("Eta sampling epsilon.", "eta"), rich_help_panel=_SAMPLE),
]
PenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--penalty",
        help=_with_default("Repetition penalty over the last --penalty-window tokens; 1 = off.", "penalty"),
        rich_help_panel=_SAMPLE,
    ),
]
PenaltyWindowOpt = Annotated[
    int | None,
    typer.Option(
        "--penalty-window",
        help=_with_default("Tokens the penalty looks back over.", "penalty_window"),
        rich_help_panel=_SAMPLE,
    ),
]
DryOpt = Annotated[
    float | None,
    typer.Option(
        "--dry",
        help=_with_default(
            "DRY multiplier: penalise tokens that extend a repeat of 2+ earlier tokens; 0 = off.", "dry_multiplier"
        ),
        rich_help_panel=_SAMPLE,
    ),
]
DryBaseOpt = Annotated[
    float | None,
    typer.Option(
        "--dry-base",
        help=_with_default("DRY growth: a repeat of n tokens loses --dry x base^(n - 2); >= 1.", "dry_base"),
        rich_help_panel=_SAMPLE,
    ),
]
XtcOpt = Annotated[
    float | None,
    typer.Option(
        "--xtc",
        help=_with_default(
            "XTC probability: at this share of positions, drop the likeliest tokens above --xtc-threshold but "
            "the least likely of them; 0 = off.",
            "xtc_probability",
        ),
        rich_help_panel=_SAMPLE,
    ),
]
XtcThresholdOpt = Annotated[
    float | None,
    typer.Option(
        "--xtc-threshold",
        help=_with_default("XTC: the probability from which a token counts as a top choice (<= 0.5).", "xtc_threshold"),
        rich_help_panel=_SAMPLE,
    ),
]
ScriptsOpt = Annotated[
    str | None,
    typer.Option(
        "--scripts",
        help=_with_default(
            "Scripts the text may use: auto (the prefix's), any, or names such as latin,greek "
            "(latin greek cyrillic armenian hebrew arabic devanagari thai georgian hangul cjk emoji).",
            "scripts",
        ),
        rich_help_panel=_SAMPLE,
    ),
]


def _rule_option(flag: str, name: str, text: str) -> typer.models.OptionInfo:
    """A flag of one of the target distribution's rules, its default shown per model."""
    return typer.Option(flag, help=_with_default(text, name), rich_help_panel=_SAMPLE, show_default=False)


SpacingOpt = Annotated[
    bool | None,
    _rule_option(
        "--spacing/--no-spacing",
        "spacing",
        "Keep words apart: no letter right after , ; ! ? nor a capital after a small letter.",
    ),
]
_WORD_HELP = (
    "No word longer than this many characters (a run without a space; CJK and other wide characters end one). 0 = off."
)
MaxWordOpt = Annotated[int | None, _rule_option("--max-word", "max_word", _WORD_HELP)]
_CAPITALS_HELP = "No more capitalised words in a row (two letters or more; a small-letter word starts again). 0 = off."
MaxCapitalisedOpt = Annotated[int | None, _rule_option("--max-capitalised", "max_capitalised", _CAPITALS_HELP)]
_SPACES_HELP = "No more whitespace characters in a row (spaces, tabs, line ends). 0 = off."
MaxSpacesOpt = Annotated[int | None, _rule_option("--max-spaces", "max_spaces", _SPACES_HELP)]
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
    bool,
    typer.Option(
        "--stop-at-eos", help="Stop at the model's end-of-sequence token (else it is never drawn).",
        rich_help_panel=_RUN,
    ),
]  # fmt: skip
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
