"""What `tokenswift write` and `tokenswift resume` do, as library calls with keyword-only arguments.

Load the model, tokenizer and heads; prefill (or restore a checkpoint); run `decode.generate`; stream
the text to stdout, `--out` and the run's `text.txt`; checkpoint every N tokens; on SIGINT/SIGTERM
finish the step, checkpoint and return 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from tokenswift_cli import __version__
from tokenswift_cli.backends.cpu import dense, int4, kernels
from tokenswift_cli.config import ConfigError, ModelSpec, RunConfig
from tokenswift_cli.engine.state import GenerationState, kv_storage, prefill
from tokenswift_cli.model import kv_rows, memory
from tokenswift_cli.model.chat import ChatRequest, prompt_tokens
from tokenswift_cli.model.rope import plan_rope
from tokenswift_cli.runs import store as runs
from tokenswift_cli.runs.checkpoint import Checkpointer, CheckpointError, read_manifest, restore
from tokenswift_cli.runs.durable import RunLock, write_atomic
from tokenswift_cli.runs.output import Output, resume_hint
from tokenswift_cli.runs.progress import QuietRenderer, Renderer
from tokenswift_cli.runs.run_model import (
    RunModel,
    bind_scripts,
    fit_kv_cache,
    fit_rope,
    fit_window,
    load_run_model,
    processor,
    suppress_eos,
    unscaled,
)  # fmt: skip
from tokenswift_cli.runs.session import Session, StopSignals, TextSink
from tokenswift_cli.runs.stops import StopMatcher
from tokenswift_cli.runs.textstream import TextStream, tokenizer_decoder


def use_threads(threads: int | None) -> None:
    """Pin torch's CPU threads (None: torch's choice); oversubscribed cores make every step much slower."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


DEFAULT_MODEL = ModelSpec()
DEFAULT_OUTPUT = Output()


def _reporting(output: Output, renderer: Renderer | None) -> Renderer:
    """`renderer`, silenced by `output.quiet`."""
    return QuietRenderer() if renderer is None or output.quiet else renderer


@contextlib.contextmanager
def _failing_run(run_dir: Path) -> Iterator[None]:
    """A run that breaks before generating is marked failed, with the reason."""
    try:
        yield
    except Exception as error:
        with contextlib.suppress(OSError):
            runs.set_status(run_dir, "failed", str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise


def _session(
    run_dir: Path,
    loaded: RunModel,
    state: GenerationState,
    stream: TextStream,
    *,
    cfg: RunConfig,
    keep_bytes: int | None,
    output: Output,
    renderer: Renderer,
    runs_dir: Path | None,
) -> Session:
    """Open the text outputs and the panel for a run whose state is ready (prefilled or restored)."""
    fingerprints = {"model": loaded.settings["fingerprint"], "heads": loaded.heads_settings["fingerprint"]}
    renderer.start(f"tokenswift · {run_dir.name} · {loaded.settings['label']}")
    echo = renderer.text if renderer.takes_text else None
    return Session(
        run_dir=run_dir, cfg=cfg, target=loaded.target, heads=loaded.heads, eos_ids=loaded.eos_ids, state=state,
        stream=stream, sink=TextSink(
            run_dir / runs.TEXT, keep_bytes=keep_bytes, out=output.out, echo=echo, out_mirrors=output.out_mirrors
        ),
        checkpointer=Checkpointer(run_dir, fingerprints=fingerprints), renderer=renderer,
        every=output.checkpoint_every, resume_hint=resume_hint(run_dir, runs_dir, output.command),
        stops=StopMatcher(cfg.stop, _text_tail(run_dir / runs.TEXT, keep_bytes, cfg.stop)), fresh=keep_bytes is None,
    )  # fmt: skip


def _text_tail(path: Path, keep_bytes: int | None, stops: Sequence[str]) -> str:
    """The end of the text a resumed run keeps: a --stop string may have begun there."""
    if not stops or not keep_bytes or not path.exists():
        return ""
    with path.open("rb") as file:
        start = max(0, keep_bytes - 4 * max(len(s) for s in stops))
        file.seek(start)
        return file.read(keep_bytes - start).decode("utf-8", errors="ignore")


# ---- the two commands ----


def write(
    *,
    prefix: str | None = None,
    request: ChatRequest | None = None,
    config: RunConfig,
    model: ModelSpec = DEFAULT_MODEL,
    heads: str = "default",
    runs_dir: Path | None = None,
    output: Output = DEFAULT_OUTPUT,
    renderer: Renderer | None = None,
) -> int:
    """Start a run: write `config.max_new_tokens` tokens after `prefix`, or answering `request` through
    the model's chat template (exactly one of them). Returns the exit code.

    `renderer` shows the run's progress and notes (the command line's panel); None says nothing."""
    root = runs.runs_root(runs_dir)
    runs.ensure_writable(root)
    output.check()
    renderer = _reporting(output, renderer)
    loaded = load_run_model(unscaled(model), heads, config, renderer.note)
    if (prefix is None) == (request is None):
        raise ConfigError("write needs a prefix or a request, not both")
    prefix = request.render(loaded.tokenizer) if request is not None else prefix
    assert prefix is not None
    prompt = prompt_tokens(loaded.tokenizer, prefix, templated=request is not None)
    if not prompt:
        raise ConfigError("the prefix has no tokens")
    config = fit_kv_cache(fit_window(config, model, loaded.target, len(prompt)), loaded.target)
    loaded = fit_rope(loaded, model, config.positions_needed(len(prompt)), renderer.note)
    config = bind_scripts(suppress_eos(config, loaded.eos_ids), loaded, prefix)
    _start_programs_before_locking(loaded.target.device.type)
    run_dir = runs.create_run(root)
    with RunLock(run_dir), _failing_run(run_dir):
        settings = {
            "version": __version__,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "run_config": config.to_dict(),
            "model": loaded.settings,
            "device": processor(loaded.target),  # a resume elsewhere says so (another GPU may round otherwise)
            "heads": loaded.heads_settings,
            "output": {"out": str(output.out.expanduser().absolute()) if output.out else None},  # resume continues it
            "prefix": {
                "file": runs.PREFIX,
                "tokens": len(prompt),
                "bytes": len(prefix.encode()),
                "request": request.to_dict() if request is not None else None,  # the prefix is its template
            },  # fmt: skip
        }
        write_atomic(run_dir / runs.PREFIX, prefix.encode())
        runs.write_settings(run_dir, settings)
        runs.set_status(run_dir, "running")
        renderer.note(
            f"{run_dir.name}: {config.max_new_tokens:,} tokens after a {len(prompt):,}-token prefix, "
            f"model {loaded.settings['label']}, heads {loaded.heads_settings['path'] or 'none'}, mode {config.mode}"
        )
        with StopSignals() as stop:
            state = prefill(loaded.target, prompt, config)
            stream = TextStream(tokenizer_decoder(loaded.tokenizer), prompt)
            session = _session(
                run_dir, loaded, state, stream, cfg=config, keep_bytes=None, output=output, renderer=renderer,
                runs_dir=runs_dir,
            )  # fmt: skip
            return session.drive(stop)


def _check_resumable(run_dir: Path, manifest: dict[str, Any] | None, cfg: RunConfig, tokens: int | None) -> int:
    """The new target; refuses a complete run (unless `tokens` raises the target) or a damaged one."""
    info = (manifest or {}).get("state", {})
    generated, name = info.get("emitted", 0), run_dir.name
    if info.get("eos_seen") and cfg.stop:
        raise CheckpointError(f"{name} is complete: its text ended at a --stop string or end-of-sequence token")
    if info.get("eos_seen") and cfg.stop_at_eos:
        raise CheckpointError(f"{name} is complete: it ended at the end-of-sequence token (--stop-at-eos)")
    target = tokens if tokens is not None else cfg.max_new_tokens
    if tokens is not None and tokens < cfg.max_new_tokens:
        raise ConfigError(f"--tokens {tokens} would lower the target of {name} ({cfg.max_new_tokens})")
    if generated >= target:
        raise CheckpointError(f"{name} is complete ({generated} tokens); raise its target with --tokens")
    text = run_dir / runs.TEXT
    size = text.stat().st_size if text.exists() else 0
    if size < info.get("text_bytes", 0):
        raise CheckpointError(f"{text} is shorter than its checkpoint ({size} < {info['text_bytes']} bytes)")
    return target


def _complete(run_dir: Path, manifest: dict[str, Any], cfg: RunConfig, tokens: int | None) -> bool:
    """Whether the checkpoint holds the whole run (its target or, with --stop-at-eos, the end token), text too."""
    info, text = manifest["state"], run_dir / runs.TEXT
    ended = info["emitted"] >= max(tokens or 0, cfg.max_new_tokens) or info["eos_seen"] and cfg.stop_at_eos
    return bool(ended) and text.exists() and text.stat().st_size >= info["text_bytes"]


def _record_done(run_dir: Path, manifest: dict[str, Any], *, quiet: bool) -> int:
    """A run stopped between its last checkpoint and recording that it was done: record it now."""
    os.truncate(run_dir / runs.TEXT, manifest["state"]["text_bytes"])
    runs.set_status(run_dir, "done")
    if not quiet:
        message = f"{run_dir.name} is complete: it stopped after its last checkpoint; now recorded as done"
        print(message, file=sys.stderr)
    return 0


def _check_same_model(run_dir: Path, settings: dict[str, Any], loaded: RunModel) -> None:
    name = run_dir.name
    if loaded.settings["fingerprint"] != settings["model"]["fingerprint"]:
        raise CheckpointError(
            f"{name} was written with another model: {settings['model']['spec']['name']} has changed "
            f"(fingerprint {loaded.settings['fingerprint'][:12]}, the run has {settings['model']['fingerprint'][:12]})"
        )
    if loaded.heads_settings["fingerprint"] != settings["heads"]["fingerprint"]:
        raise CheckpointError(f"{name} was written with other draft heads: {settings['heads']['path']} has changed")


def _start_programs_before_locking(device_type: str | None) -> None:
    """Run now what starts other programs (`ldconfig` for libc; on a CPU, the kernels' compiler checks): one
    starting while the run's lock is held holds it too until it execs (a run killed then looks alive)."""
    memory.libc()
    if device_type == "cpu" or device_type is None and not torch.cuda.is_available():
        kernels.available()


def _check_device_here(run_dir: Path, settings: dict[str, Any]) -> None:
    recorded = settings.get("device")  # (runs written before 2026-11-27 record none)
    if recorded is not None and recorded["type"] == "cuda" and not torch.cuda.is_available():
        raise runs.RunError(
            f"{run_dir.name} was written on a GPU ({recorded['name']}) and this machine has no CUDA device: "
            "resume it on one"
        )


def _note_other_arithmetic(run_dir: Path, settings: dict[str, Any], loaded: RunModel, renderer: Renderer) -> None:
    """A run whose quantised products or 8-bit KV cache were computed otherwise goes on, and says so."""
    model, parted = settings["model"], "the text stays the model's, but may part from what the first would have written"
    recorded = model.get("arithmetic", int4.EARLIER if model["spec"].get("weights") == "int4" else None)
    here = loaded.settings.get("arithmetic")
    if recorded != here:
        by, now = recorded or "dense weights", here or "dense weights"
        renderer.note(f"{run_dir.name}: 4-bit products computed from {by}; resumes with {now}: {parted}")
    recorded, here = model.get("dense_arithmetic", dense.EARLIER), loaded.settings.get("dense_arithmetic")
    if None not in (recorded, here) and recorded != here:
        renderer.note(f"{run_dir.name} was written with dense products by {recorded}, resumes with {here}: {parted}")
    recorded, here = model.get("kv_arithmetic", kv_rows.EARLIER), loaded.settings.get("kv_arithmetic")
    if settings["run_config"].get("kv_cache") == "int8" and recorded != here:
        renderer.note(
            f"{run_dir.name} was written with its 8-bit KV cache read by {recorded}, resumes with {here}: {parted}"
        )


def _note_other_device(run_dir: Path, settings: dict[str, Any], loaded: RunModel, renderer: Renderer) -> None:
    recorded, here = settings.get("device"), processor(loaded.target)
    if recorded is not None and recorded != here:
        renderer.note(
            f"{run_dir.name} was written on {recorded['name']} ({recorded['type']}), resumes on {here['name']} "
            f"({here['type']}): the text stays the model's, but may part from what the first would have written"
        )


def resume(
    *,
    run: str,
    tokens: int | None = None,
    runs_dir: Path | None = None,
    output: Output = DEFAULT_OUTPUT,
    renderer: Renderer | None = None,
) -> int:
    """Continue a run to its target (`tokens` raises it); only the new text goes to stdout."""
    run_dir = runs.resolve_run(runs.runs_root(runs_dir), run)
    output.check()
    _start_programs_before_locking(runs.recorded_device(run_dir))
    with RunLock(run_dir):
        # Every check (settings, checksums, fingerprints) comes before the first write to the run.
        settings = runs.read_settings(run_dir)
        cfg = RunConfig.from_dict(settings["run_config"])
        manifest = read_manifest(run_dir)
        stopped = runs.recorded_state(run_dir) != "done"  # a done run's complete checkpoint means done
        if manifest is not None and stopped and _complete(run_dir, manifest, cfg, tokens):
            return _record_done(run_dir, manifest, quiet=output.quiet)
        cfg = cfg.replace(max_new_tokens=_check_resumable(run_dir, manifest, cfg, tokens))
        output = output.continuing((settings.get("output") or {}).get("out"))
        renderer = _reporting(output, renderer)
        spec = ModelSpec(**settings["model"]["spec"])  # resolved: the very model the run started with
        _check_device_here(run_dir, settings)
        loaded = load_run_model(spec, settings["heads"]["path"] or "none", cfg, renderer.note)
        _check_same_model(run_dir, settings, loaded)
        _note_other_device(run_dir, settings, loaded, renderer)
        _note_other_arithmetic(run_dir, settings, loaded, renderer)
        cfg = bind_scripts(cfg, loaded)
        warning = plan_rope(
            spec, loaded.target.model.config, cfg.positions_needed(settings["prefix"]["tokens"])
        ).warning()
        if warning:
            renderer.note(warning)
        decode = tokenizer_decoder(loaded.tokenizer)
        if manifest is None:  # stopped before its first checkpoint: start over from the prefix
            # Bytes, not read_text: newline translation would turn a "\r\n" prefix into other tokens.
            prefix = (run_dir / runs.PREFIX).read_bytes().decode("utf-8")
            templated = settings["prefix"].get("request") is not None
            prompt = prompt_tokens(loaded.tokenizer, prefix, templated=templated)
            state, stream, keep = prefill(loaded.target, prompt, cfg), TextStream(decode, prompt), 0
        else:
            target = loaded.target
            restored = restore(
                run_dir, manifest, cfg=cfg, num_layers=target.num_layers, device=target.device,
                dtype=target.dtype, kv_dtype=kv_storage(cfg, target), layer_devices=target.layer_devices,
            )  # fmt: skip
            state, stream, keep = restored.state, TextStream(decode, state=restored.stream), restored.text_bytes
            memory.trim()  # what loading and reading the checkpoint freed
        with _failing_run(run_dir), StopSignals() as stop:
            if cfg.max_new_tokens != settings["run_config"]["max_new_tokens"]:
                runs.write_settings(run_dir, {**settings, "run_config": cfg.to_dict()})
            runs.set_status(run_dir, "running")
            lost = (run_dir / runs.TEXT).stat().st_size - keep if (run_dir / runs.TEXT).exists() else 0
            renderer.note(
                f"{run_dir.name}: resuming at {state.stats.generated}/{cfg.max_new_tokens} tokens"
                + (f" ({lost} bytes written after the last checkpoint are written again)" if lost > 0 else "")
            )
            session = _session(
                run_dir, loaded, state, stream, cfg=cfg, keep_bytes=keep, output=output, renderer=renderer,
                runs_dir=runs_dir,
            )  # fmt: skip
            session.emit(_backlog(state, cfg, loaded.eos_ids))
            return session.drive(stop)


def _backlog(state: GenerationState, cfg: RunConfig, eos_ids: Sequence[int]) -> list[int]:
    """Committed tokens past the old target (the last step of a finished run commits a few more)."""
    start = state.prefix_length + state.stats.generated
    pending = state.tokens[start : state.prefix_length + cfg.max_new_tokens]
    if cfg.stop_at_eos:
        for i, token in enumerate(pending):
            if token in eos_ids:
                pending, state.eos_seen = pending[: i + 1], True
                break
    state.stats.generated += len(pending)
    return pending
