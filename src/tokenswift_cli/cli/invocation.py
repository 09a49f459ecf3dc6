"""How the user ran this tool, so that the commands it prints (how to resume a run) work when pasted."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path


def program_name() -> str:
    """How the user ran this tool, so that a printed command works when pasted: `.venv/bin/tokenswift`
    where the tool is not on PATH, `python -m tokenswift_cli` for the module."""
    invoked = sys.argv[0] if sys.argv else ""
    if Path(invoked).name == "__main__.py" and Path(invoked).parent.name == "tokenswift_cli":
        return f"{shlex.quote(sys.executable)} -m tokenswift_cli"
    if Path(invoked).name != "tokenswift":  # called from Python (tests, the library): the usual name
        return "tokenswift"
    on_path = shutil.which("tokenswift")
    same = on_path is not None and Path(on_path).resolve() == Path(invoked).resolve()
    return "tokenswift" if same else shlex.quote(invoked)
