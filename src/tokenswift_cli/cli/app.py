"""The `tokenswift` command. Thin: it parses flags into configs and calls `runner` with keyword arguments.

Every error a user can cause ends in one line `error: ...` on stderr and exit code 2 (1 for a
failure during generation), never a traceback. Torch is imported only when a command runs, so
`--help` is instant. The other commands' modules add them with `register(app)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, cast

import typer
from typer.core import TyperGroup

from tokenswift_cli import __version__
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
    KVCacheOpt,
    LookupOpt,
    MinPOpt,
    ModelOpt,
    ModeOpt,
    NGramTopKOpt,
    OutOpt,
    PartialBudgetOpt,
    PenaltyOpt,
    PenaltyWindowOpt,
    PrefixOpt,
    QuietOpt,
    RaiseTokensOpt,
    RopeFactorOpt,
    RopeScalingOpt,
    RunArg,
    RunsDirOpt,
    ScriptsOpt,
    SeedOpt,
    SinksOpt,
    StopAtEosOpt,
    TemperatureOpt,
    ThreadsOpt,
    TokensOpt,
    TopKOpt,
    TopPOpt,
    TreeOpt,
    WeightsOpt,
    off_if_zero,
    parse_tokens,
    parse_tree,
    parse_window,
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
from tokenswift_cli.sampling.defaults import default_sampling
from tokenswift_cli.sampling.scripts import parse_scripts


class OneLineErrors(TyperGroup):
    """Usage errors as one line `error: ...` (exit code 2) instead of a usage box."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:  # fmt: skip
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except typer.TyperException as error:  # typer's own click: usage errors, bad parameters
            message = error.format_message()
            if "\n" in message:  # no arguments: the message is the help text
                typer.echo(message, err=True)
            else:
                ctx = getattr(error, "ctx", None)
                where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                typer.echo(f"error: {message}{where}", err=True)
            code = error.exit_code
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=OneLineErrors,
    name="tokenswift",
    help="Write very long texts with a language model, several times faster than plain decoding, "
    "with exactly the text the model alone would write (TokenSwift).\n\n"
    "Example: tokenswift write --prefix novel.txt --tokens 100k > book.txt",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Errors a user can cause; those of modules not imported yet cannot have been raised."""
    from tokenswift_cli.runs.checkpoint import CheckpointError
    from tokenswift_cli.runs.store import RunError

    found: list[type[BaseException]] = [ConfigError, CheckpointError, RunError, OSError]
    for module, name in (("model.loading", "ModelLoadError"), ("model.heads", "HeadsError")):
        loaded = sys.modules.get(f"tokenswift_cli.{module}")
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """One line on stderr and exit code 2 for user errors, 1 for failures during generation."""
    try:
        yield
    except (typer.Exit, typer.TyperException, KeyboardInterrupt):
        raise
    except Exception as error:
        session = sys.modules.get("tokenswift_cli.runs.session")
        if session is not None and isinstance(error, session.RunFailed):
            code = 1
        elif isinstance(error, _user_error_types()):
            code = 2
        elif os.environ.get("TOKENSWIFT_DEBUG"):
            raise
        else:
            typer.echo(f"error: internal error, {type(error).__name__}: {_one_line(error)} "
                       "(TOKENSWIFT_DEBUG=1 shows the traceback)", err=True)  # fmt: skip
            raise typer.Exit(1) from None
        typer.echo(f"error: {_one_line(error)}", err=True)
        raise typer.Exit(code) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tokenswift {__version__}")
        raise typer.Exit()


def sampling_for(model: str, **given: float | int | str | tuple[str, ...] | None) -> SamplingConfig:
    """The measured defaults for `model` (defaults.py), overridden by every flag the user set."""
    chosen = {name: value for name, value in given.items() if value is not None}
    return dataclasses.replace(default_sampling(model), **chosen)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Write very long texts fast and losslessly (TokenSwift)."""


@app.command(epilog="Example: tokenswift write --prefix novel.txt --tokens 100k --temperature 0.8 --seed 7 > book.txt")
def write(
    prefix: PrefixOpt,
    tokens: TokensOpt,
    model: ModelOpt = "default",
    heads: HeadsOpt = "default",
    dtype: DTypeOpt = "auto",
    weights: WeightsOpt = "auto",
    device: DeviceOpt = "cpu",
    rope_scaling: RopeScalingOpt = "auto",
    rope_factor: RopeFactorOpt = None,
    context_window: ContextWindowOpt = "auto",
    sinks: SinksOpt = DEFAULT_SINKS,
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
    scripts: ScriptsOpt = None,
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
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Write --tokens tokens after the text of --prefix; the text streams to stdout.

    The run is checkpointed as it goes; Ctrl-C stops it after the current step, and `tokenswift resume`
    continues it with exactly the text an uninterrupted run would have written.
    """
    with errors():
        sampling = sampling_for(
            model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, eta=eta, penalty=penalty,
            penalty_window=penalty_window, seed=seed, dry_multiplier=dry or None,
            dry_base=dry_base, scripts=None if scripts is None else parse_scripts(scripts),
        )  # fmt: skip
        if dry == 0:  # "0 = off", also when the model's defaults turn DRY on
            sampling = dataclasses.replace(sampling, dry_multiplier=None)
        drafting = DraftConfig(
            tree=parse_tree(tree), ngram_top_k=off_if_zero(ngram_top_k), partial_budget=off_if_zero(partial_budget),
            lookup_length=off_if_zero(lookup),
        ).drafting(draft)  # fmt: skip
        # The Literal-typed fields are checked by the configs themselves (one-line ConfigError).
        config = RunConfig(
            max_new_tokens=parse_tokens(tokens), mode=cast(Mode, mode), stop_at_eos=stop_at_eos, sampling=sampling,
            draft=drafting, window=parse_window(context_window, sinks, model), kv_cache=cast(KVCache, kv_cache),
        )  # fmt: skip
        spec = ModelSpec(
            name=model, dtype=cast(DType, dtype), device=device, rope_scaling=cast(RopeScaling, rope_scaling),
            rope_factor=rope_factor, weights=cast(Weights, weights),
        )  # fmt: skip
        from tokenswift_cli.runs import runner

        runner.use_threads(threads)
        output = runner.Output(out=out, checkpoint_every=checkpoint_every, quiet=quiet)
        text = runner.read_prefix(prefix)
        code = runner.write(prefix=text, config=config, model=spec, heads=heads, runs_dir=runs_dir, output=output)
    raise typer.Exit(code)


@app.command(epilog="Example: tokenswift resume run-042 >> book.txt")
def resume(
    run: RunArg,
    tokens: RaiseTokensOpt = None,
    out: OutOpt = None,
    checkpoint_every: CheckpointEveryOpt = DEFAULT_CHECKPOINT_EVERY,
    runs_dir: RunsDirOpt = None,
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
) -> None:
    """Continue a stopped run to its target, exactly as if it had never stopped.

    Only the new text goes to stdout (and to --out, appended); the run's text.txt holds all of it.
    """
    with errors():
        target = parse_tokens(tokens) if tokens is not None else None
        from tokenswift_cli.runs import runner

        runner.use_threads(threads)
        output = runner.Output(out=out, checkpoint_every=checkpoint_every, quiet=quiet)
        code = runner.resume(run=run, tokens=target, runs_dir=runs_dir, output=output)
    raise typer.Exit(code)


def _register_commands(target: typer.Typer) -> None:
    """The commands that live in their own modules (write and resume are above)."""
    from tokenswift_cli.cli import bench, eval, heads, runs

    for module in (runs, heads, bench, eval):
        module.register(target)


_register_commands(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
