"""System tools some tests drive (tmux, tesseract): from PATH, else installed from Debian's
packages when the tests run as root (CI's fresh machine); the test is skipped only when neither works."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def system_tool(command: str, package: str) -> str:
    """The path of `command`, installing Debian's `package` for it if need be."""
    found = shutil.which(command)
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", package]
        for step in (install, ["apt-get", "update", "-q"], install):
            subprocess.run(step, env=env, capture_output=True, timeout=600)
            if found := shutil.which(command):
                return found
    pytest.skip(f"{command} is not installed and could not be installed with apt-get (needs root and Debian's packages)")


_MOUNT = 'home=$1; options=$2; shift 2; mount -t tmpfs -o "$options" tmpfs "$home" && exec "$@"'


def on_tmpfs(home: Path, options: str) -> list[str]:
    """The prefix of a command that runs with `home` a new tmpfs mounted with `options` (`ro` for a
    read-only file system, `size=300k` for a full one), in a user and mount namespace of its own
    (unshare): nothing is mounted outside it, and root's permissions do not bite on it. The test
    is skipped where the kernel lets no one here make such a namespace."""
    prefix = _tmpfs_prefix(home, options)
    if isinstance(prefix, str):
        pytest.skip(prefix)
    return prefix


def read_only_home(home: Path) -> list[str]:
    """The prefix of a command that runs with `home` read-only: a read-only tmpfs (on_tmpfs), else
    `home` without write permission where permissions bite (not for root); else the test is skipped."""
    prefix = _tmpfs_prefix(home, "ro")
    if isinstance(prefix, list):
        return prefix
    if os.geteuid() == 0:
        pytest.skip(f"{prefix}, and root writes in a folder without write permission")
    home.chmod(0o555)
    return []


def _tmpfs_prefix(home: Path, options: str) -> list[str] | str:
    """on_tmpfs's prefix, or why there is none."""
    home.mkdir(parents=True, exist_ok=True)
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed: no tmpfs can be mounted for the test"
    prefix = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _MOUNT, "sh", str(home), options]
    tried = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    if tried.returncode != 0:
        return f"no tmpfs can be mounted in a namespace of the test's own ({tried.stderr.strip()})"
    return prefix
