"""`tokenswift write`: flags into configs, then `runner.write` with the command line's panel.

Torch is imported only when the command runs, so `tokenswift --help` stays instant.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

import typer

from tokenswift_cli.cli.errors import errors
from tokenswift_cli.cli.help import Command
from tokenswift_cli.cli.invocation import program_name
from tokenswift_cli.cli.options import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_LOOKUP,
    DEFAULT_NGRAM_TOP_K,
    DEFAULT_PARTIAL_BUDGET,
    DEFAULT_TREE,
    SAMPLING_DEFAULTS,
    CheckpointEveryOpt,
    ContextWindowOpt,
    DeviceOpt,
    DraftOpt,
    DryBaseOpt,
    DryOpt,
    DTypeOpt,
    EtaOpt,
    HeadsOpt,
    KeepOpt,
    KVCacheOpt,
    LookupOpt,
    MaxCapitalisedOpt,
    MaxSpacesOpt,
    MaxWordOpt,
    MinPOpt,
    ModelOpt,
    ModeOpt,
    NGramTopKOpt,
    OutOpt,
    PartialBudgetOpt,
    PenaltyOpt,
    PenaltyWindowOpt,
    PrefixOpt,
    PromptFileOpt,
    PromptOpt,
    QuietOpt,
    RopeFactorOpt,
    RopeScalingOpt,
    RunsDirOpt,
    ScriptsOpt,
    SeedOpt,
    SpacingOpt,
    StopAtEosOpt,
    StopOpt,
    SystemOpt,
    TemperatureOpt,
    ThreadsOpt,
    TokensOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    WeightsOpt,
    XtcOpt,
    XtcThresholdOpt,
)
from tokenswift_cli.config import (
    DEFAULT_SINKS,
    ConfigError,
    DraftConfig,
    DType,
    KVCache,
    Mode,
    ModelSpec,
    RopeScaling,
    RunConfig,
    SamplingConfig,
    Weights,
)
from tokenswift_cli.parsing import off_if_zero, parse_keep, parse_tokens, parse_tree, parse_window, resolve_device
from tokenswift_cli.sampling.defaults import default_sampling
from tokenswift_cli.sampling.scripts import parse_scripts

if TYPE_CHECKING:
    from tokenswift_cli.model.chat import ChatRequest

EXAMPLE = 'Example: tokenswift write --prompt "Write a long story about a lighthouse keeper" --tokens 20k > story.txt'


def register(app: typer.Typer) -> None:
    """Add `write` to the main app."""
    app.command("write", cls=Command, epilog=EXAMPLE)(write)


def sampling_for(model: str, **given: float | int | str | tuple[str, ...] | None) -> SamplingConfig:
    """The measured defaults for `model` (defaults.py), overridden by every flag the user set."""
    chosen: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    return dataclasses.replace(default_sampling(model), **chosen)


def write(
    tokens: TokensOpt,
    prefix: PrefixOpt = None,
    prompt: PromptOpt = None,
    prompt_file: PromptFileOpt = None,
    system: SystemOpt = None,
    model: ModelOpt = "default",
    heads: HeadsOpt = "default",
    dtype: DTypeOpt = "auto",
    weights: WeightsOpt = "auto",
    device: DeviceOpt = None,
    rope_scaling: RopeScalingOpt = "auto",
    rope_factor: RopeFactorOpt = None,
    context_window: ContextWindowOpt = "auto",
    keep: KeepOpt = None,
    kv_cache: KVCacheOpt = "auto",
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    eta: EtaOpt = None,
    penalty: PenaltyOpt = None,
    penalty_window: PenaltyWindowOpt = None,
    dry: DryOpt = None,
    dry_base: DryBaseOpt = None,
    xtc: XtcOpt = None,
    xtc_threshold: XtcThresholdOpt = None,
    scripts: ScriptsOpt = None,
    spacing: SpacingOpt = None,
    max_word: MaxWordOpt = None,
    max_capitalised: MaxCapitalisedOpt = None,
    max_spaces: MaxSpacesOpt = None,
    seed: SeedOpt = SAMPLING_DEFAULTS.seed,
    mode: ModeOpt = "tokenswift",
    tree: TreeOpt = DEFAULT_TREE,
    ngram_top_k: NGramTopKOpt = DEFAULT_NGRAM_TOP_K,
    partial_budget: PartialBudgetOpt = DEFAULT_PARTIAL_BUDGET,
    draft: DraftOpt = "auto",
    lookup: LookupOpt = DEFAULT_LOOKUP,
    out: OutOpt = None,
    checkpoint_every: CheckpointEveryOpt = DEFAULT_CHECKPOINT_EVERY,
    runs_dir: RunsDirOpt = None,
    stop_at_eos: StopAtEosOpt = False,
    stop: StopOpt = None,
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Write --tokens tokens: continue the text of --prefix, or answer --prompt; the text streams to stdout.

    The run is checkpointed as it goes; Ctrl-C stops it after the current step, and `tokenswift resume`
    continues it with exactly the text an uninterrupted run would have written.
    """
    with errors():
        sampling = sampling_for(
            model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, eta=eta, penalty=penalty,
            penalty_window=penalty_window, seed=seed, dry_multiplier=dry or None,
            dry_base=dry_base, xtc_probability=xtc or None, xtc_threshold=xtc_threshold,
            scripts=None if scripts is None else parse_scripts(scripts), spacing=spacing,
            max_word=max_word or None, max_capitalised=max_capitalised or None, max_spaces=max_spaces or None,
        )  # fmt: skip
        flags = {"dry_multiplier": dry, "xtc_probability": xtc, "max_word": max_word,
                 "max_capitalised": max_capitalised, "max_spaces": max_spaces}  # fmt: skip
        # "0 = off", also when the model's defaults turn the setting on
        sampling = dataclasses.replace(sampling, **{name: None for name, flag in flags.items() if flag == 0})
        drafting = DraftConfig(
            tree=parse_tree(tree), ngram_top_k=off_if_zero(ngram_top_k), partial_budget=off_if_zero(partial_budget),
            lookup_length=off_if_zero(lookup),
        ).drafting(draft)  # fmt: skip
        # A request stays in view whole by default (issue 24); a text to continue keeps its first tokens.
        asked = prompt is not None or prompt_file is not None
        kept = parse_keep(keep) if keep is not None else "prompt" if asked else DEFAULT_SINKS
        # The Literal-typed fields are checked by the configs themselves (one-line ConfigError).
        config = RunConfig(
            max_new_tokens=parse_tokens(tokens), mode=cast(Mode, mode), stop_at_eos=stop_at_eos, sampling=sampling,
            draft=drafting, window=parse_window(context_window, kept, model), kv_cache=cast(KVCache, kv_cache),
            stop=tuple(stop or ()),
        )  # fmt: skip
        spec = ModelSpec(
            name=model, dtype=cast(DType, dtype), device=resolve_device(device),
            rope_scaling=cast(RopeScaling, rope_scaling), rope_factor=rope_factor, weights=cast(Weights, weights),
        )  # fmt: skip
        from tokenswift_cli.cli.panel import make_renderer
        from tokenswift_cli.runs import runner

        runner.use_threads(threads)
        output = runner.Output(out=out, checkpoint_every=checkpoint_every, quiet=quiet, command=program_name())
        text, request = _what_to_write(prefix, prompt, prompt_file, system)
        code = runner.write(
            prefix=text, request=request, config=config, model=spec, heads=heads, runs_dir=runs_dir, output=output,
            renderer=make_renderer(quiet=quiet),
        )  # fmt: skip
    raise typer.Exit(code)


def _what_to_write(
    prefix: str | None, prompt: str | None, prompt_file: str | None, system: str | None
) -> tuple[str | None, ChatRequest | None]:
    """The text to continue, or the request to answer: exactly one of --prefix, --prompt, --prompt-file."""
    from tokenswift_cli.model.chat import ChatRequest
    from tokenswift_cli.runs.output import read_prefix

    sources = (("--prefix", prefix), ("--prompt", prompt), ("--prompt-file", prompt_file))
    given = [name for name, value in sources if value is not None]
    if len(given) != 1:
        raise ConfigError(
            "say what to write: --prefix FILE (a text to continue) or --prompt TEXT / --prompt-file FILE (a request)"
            if not given
            else f"use one of {' and '.join(given)}, not both"
        )
    if system is not None and prefix is not None:
        raise ConfigError("--system goes with --prompt or --prompt-file, not --prefix")
    if prefix is not None:
        return read_prefix(prefix), None
    request = prompt if prompt is not None else read_prefix(str(prompt_file), what="prompt")
    return None, ChatRequest(prompt=request, system=system)
