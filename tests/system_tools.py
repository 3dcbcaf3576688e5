"""System tools some tests drive (tmux, tesseract): from PATH, else installed from Debian's
packages when the tests run as root (CI's fresh machine); the test is skipped only when neither works."""

from __future__ import annotations

import os
import shutil
import subprocess

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
