"""What a run reads and writes besides its folder: the prefix file, --out, and what it tells the user."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenswift_cli.config import ConfigError
from tokenswift_cli.runs import store as runs


@dataclass(frozen=True)
class Output:
    """Where the text goes besides stdout and the run folder, how often to checkpoint, how much to say."""

    out: Path | None = None
    checkpoint_every: int = 512
    quiet: bool = False
    command: str = "tokenswift"  # how the user runs the tool, for the resume hint
    out_mirrors: bool = False  # `out` is the run's own --out file, which holds all of its text

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1:
            raise ConfigError("--checkpoint-every must be >= 1")

    def continuing(self, recorded: str | None) -> Output:
        """On resume: the run's own --out file unless another is given."""
        if recorded is None or (self.out is not None and self.out.expanduser().absolute() != Path(recorded)):
            return self
        if self.out is None and not Path(recorded).parent.is_dir():  # its folder is gone: text.txt has it all
            return self
        return dataclasses.replace(self, out=Path(recorded), out_mirrors=True)

    def check(self) -> None:
        """Refuse an --out file that cannot be created, before any run folder is."""
        if self.out is not None and not self.out.expanduser().absolute().parent.is_dir():
            raise ConfigError(f"cannot write {self.out}: its folder does not exist")
        if self.out is not None and self.out.is_dir():
            raise ConfigError(f"cannot write {self.out}: it is a folder")


def resume_hint(run_dir: Path, runs_dir: Path | None, command: str) -> str:
    """The command that resumes the run, as the user can paste it."""
    extra = f" --runs-dir {shlex.quote(str(runs.runs_root(runs_dir)))}" if runs_dir is not None else ""
    return f"resume with: {command} resume {run_dir.name}{extra}"


def read_prefix(source: str, what: str = "prefix") -> str:
    """The text of a file or `-` (stdin); refuses missing, empty, binary or non-UTF-8 input."""
    name = "from standard input" if source == "-" else source
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            path = Path(source).expanduser()
            if not path.exists():
                raise ConfigError(f"{what} file not found: {source}")
            if path.is_dir():
                raise ConfigError(f"the {what} {source} is a folder, not a text file")
            data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read the {what} {name} ({error.strerror or error})") from None
    if not data.strip():
        raise ConfigError(f"the {what} {name} is empty")
    if b"\0" in data:
        raise ConfigError(f"the {what} {name} is a binary file, not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} {name} is not UTF-8 text") from None
    return text.removeprefix("\ufeff")
