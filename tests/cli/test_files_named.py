"""The files `kvchat ask` and `kvchat read` take from the paths named: a quoted `**` glob never enters
a linked folder, and a file named twice (by two paths, a glob and a path, a link) is read once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvchat.cli.files import files_named
from tests.cli.test_cli import run_kvchat

LOOP_WITHIN_S = 60  # on a busy 2-core machine; before, the loop ran until killed


@pytest.fixture
def looped(tmp_path: Path) -> Path:
    """`d/c.txt`, `d/sub/e.txt`, and links from `d` to itself (a loop), and to `c.txt`."""
    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    (folder / "c.txt").write_text("The fee is 5 dollars.\n")
    (folder / "sub" / "e.txt").write_text("The fine is 9 dollars.\n")
    for name in ("l1", "l2", "l3"):
        (folder / name).symlink_to(".")
    (folder / "also-c.txt").symlink_to("c.txt")
    return folder


def test_a_double_star_glob_does_not_enter_linked_folders_and_lists_each_file_once(looped, monkeypatch) -> None:
    monkeypatch.chdir(looped.parent)
    assert list(files_named(["d/**/*.txt"])) == [(Path("d/also-c.txt"), None), (Path("d/sub/e.txt"), None)]
    assert list(files_named([f"{looped}/**/e.txt"])) == [(looped / "sub" / "e.txt", None)]


def test_a_file_named_twice_comes_once_where_first_named(looped, monkeypatch) -> None:
    monkeypatch.chdir(looped)
    assert list(files_named(["c.txt", "./c.txt", "*.txt", str(looped / "c.txt"), "sub", "sub/e.txt"])) == [
        (Path("c.txt"), None), (Path("sub/e.txt"), None)]


def test_hidden_files_match_only_a_pattern_that_asks_for_them(tmp_path, monkeypatch) -> None:
    (tmp_path / ".notes").mkdir()
    (tmp_path / ".notes" / "n.txt").write_text("n")
    (tmp_path / "a.txt").write_text("a")
    monkeypatch.chdir(tmp_path)
    assert list(files_named(["**/*.txt"])) == [(Path("a.txt"), None)]
    assert list(files_named([".*/*.txt"])) == [(Path(".notes/n.txt"), None)]


@pytest.mark.system
def test_read_of_a_glob_through_a_link_loop_ends(looped, tiny_model_path, isolated_home) -> None:
    done = run_kvchat("read", str(looped / "**" / "*.txt"), "--model", str(tiny_model_path), "--threads", "2",
                      home=isolated_home, timeout=LOOP_WITHIN_S)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("2 documents, ") and lines[-1] == "2 read"


@pytest.mark.system
def test_ask_puts_a_file_reached_by_several_paths_in_the_prompt_once(looped, tiny_model_path, isolated_home) -> None:
    os.unlink(looped / "l2"), os.unlink(looped / "l3"), os.unlink(looped / "sub" / "e.txt")  # a loop: `ln -s . self`
    args = ["How much is the fee?", "--model", str(tiny_model_path), "--max-tokens", "1", "--threads", "2", "--json"]
    once = run_kvchat("ask", str(looped / "c.txt"), *args, home=isolated_home)
    globbed = run_kvchat("ask", str(looped / "**" / "*.txt"), str(looped / "c.txt"), *args, home=isolated_home)
    assert once.returncode == globbed.returncode == 0, globbed.stderr
    assert json.loads(globbed.stdout)["kept_by_document"] == {}  # one document, not a bundle of copies
    assert json.loads(globbed.stdout)["prompt_tokens"] == json.loads(once.stdout)["prompt_tokens"]


def test_a_name_that_looks_like_a_glob_but_exists_is_that_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "report[1].txt").write_text("r")
    monkeypatch.chdir(tmp_path)
    assert list(files_named(["report[1].txt"])) == [(Path("report[1].txt"), None)]
