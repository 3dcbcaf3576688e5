"""Models other tools keep, used where they are: Ollama's store, LM Studio's folders and the
Hugging Face cache laid out as those tools write them under a temporary HOME, with the tiny GGUF
as the model; and the draft paired with a model by vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvchat.engine import drafts
from kvchat.errors import ModelError
from kvchat.llama import LlamaModel
from kvchat.models import resolve_model
from tests.cli.test_cli import run_kvchat
from tests.tiny_gguf import CHATML_TEMPLATE, write_tiny_gguf

OLLAMA_HEX = "0123abcd" + "0" * 56  # the sha256 Ollama names the tiny model's blob by


@pytest.fixture
def home(tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME with `ollama pull tiny` and `lms get pub/tiny-GGUF` done, as far as their files go."""
    home = tmp_path / "home"
    blob = home / ".ollama" / "models" / "blobs" / f"sha256-{OLLAMA_HEX}"
    blob.parent.mkdir(parents=True)
    shutil.copy(tiny_model_path, blob)
    manifest = home / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256-ffff"},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{OLLAMA_HEX}", "size": blob.stat().st_size}]}))
    studio = home / ".lmstudio" / "models" / "pub" / "tiny-GGUF"
    studio.mkdir(parents=True)
    shutil.copy(tiny_model_path, studio / "tiny-Q8_0.gguf")
    repo = home / ".cache" / "huggingface" / "hub" / "models--acme--Tiny-GGUF"  # as huggingface_hub lays out a download
    commit = "a" * 40
    for quant in ("Q4_K_M", "Q8_0"):
        blob = repo / "blobs" / f"{quant.lower()}{'0' * 58}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_model_path, blob)
        link = repo / "snapshots" / commit / f"tiny-{quant}.gguf"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HOME", str(home))
    for variable in ("OLLAMA_MODELS", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    return home


def test_store_names_resolve_to_the_files_the_tools_keep(home: Path) -> None:
    assert resolve_model("ollama:tiny") == resolve_model("ollama:tiny:latest") == home / f".ollama/models/blobs/sha256-{OLLAMA_HEX}"
    assert resolve_model("lmstudio:pub/tiny-GGUF") == home / ".lmstudio/models/pub/tiny-GGUF/tiny-Q8_0.gguf"
    assert resolve_model("lmstudio:pub/tiny-GGUF/tiny-Q8_0.gguf") == resolve_model("lmstudio:pub/tiny-GGUF")
    with pytest.raises(ModelError) as missing:
        resolve_model("ollama:qwen2.5:7b")
    assert missing.value.one_line() == f"no Ollama model qwen2.5:7b in {home}/.ollama/models (hint: ollama pull qwen2.5:7b)"
    with pytest.raises(ModelError) as absent:
        resolve_model("lmstudio:pub/other-GGUF")
    assert absent.value.hint == "lms get pub/other-GGUF"
    snapshot = home / ".cache/huggingface/hub/models--acme--Tiny-GGUF/snapshots" / ("a" * 40)
    assert resolve_model("hf:acme/Tiny-GGUF:q8_0") == resolve_model("hf:acme/Tiny-GGUF:tiny-Q8_0.gguf") == snapshot / "tiny-Q8_0.gguf"
    with pytest.raises(ModelError, match="matches 2 files"):
        resolve_model("hf:acme/Tiny-GGUF")
    with pytest.raises(ModelError) as not_cached:
        resolve_model("hf:acme/Other-GGUF:Q4_K_M")
    assert not_cached.value.hint == "huggingface-cli download acme/Other-GGUF --include '*Q4_K_M*'"
    shutil.copy(home / ".lmstudio/models/pub/tiny-GGUF/tiny-Q8_0.gguf", home / ".lmstudio/models/pub/tiny-GGUF/tiny-Q4_0.gguf")
    with pytest.raises(ModelError, match="holds 2 models"):
        resolve_model("lmstudio:pub/tiny-GGUF")


@pytest.mark.system
def test_an_ollama_digest_that_is_not_a_sha256_names_no_file(home: Path, tmp_path: Path, isolated_home: Path) -> None:
    """A manifest's digest of "/etc/passwd" (or "../x") would name a file outside Ollama's blobs."""
    outside = tmp_path / "outside.gguf"
    shutil.copy(home / f".ollama/models/blobs/sha256-{OLLAMA_HEX}", outside)
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/evil/latest"
    manifest.parent.mkdir(parents=True)
    for digest in (str(outside), f"sha256:../../../{outside.parent.name}/{outside.name}", f"sha256:{OLLAMA_HEX.upper()}", 7):
        manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
        with pytest.raises(ModelError) as refused:
            resolve_model("ollama:evil")
        assert refused.value.message.startswith("Ollama's manifest of evil:latest names its model file by ")
        assert refused.value.message.endswith(f", not by a sha256 ({manifest})")
    listed = run_kvchat("models", "--json", home=isolated_home, env={"HOME": str(home)})
    assert listed.returncode == 0 and "ollama:evil:latest" not in listed.stdout and str(outside) not in listed.stdout


@pytest.mark.system
def test_a_hugging_face_cache_that_is_a_file_is_left_out_with_a_note(home: Path, tmp_path: Path, isolated_home: Path) -> None:
    not_a_folder = tmp_path / "passwd"
    not_a_folder.write_text("root:x:0:0::/root:/bin/sh\n")
    env = {"HOME": str(home), "HF_HUB_CACHE": str(not_a_folder)}
    listed = run_kvchat("models", "--json", home=isolated_home, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == (f"kvchat: the Hugging Face cache {not_a_folder} is not a folder: its models are left out "
                             "(check HF_HUB_CACHE and HF_HOME)\n")
    found = {row["name"] for row in json.loads(listed.stdout) if row["source"] != "registry"}
    assert found == {"ollama:tiny:latest", "lmstudio:pub/tiny-GGUF/tiny-Q8_0.gguf"}
    asked = run_kvchat("ask", str(not_a_folder), "Who?", "-m", "hf:acme/Tiny-GGUF", home=isolated_home, env=env)
    assert asked.returncode == 1 and asked.stderr.startswith(f"kvchat: error: the Hugging Face cache {not_a_folder} is not a folder")


@pytest.mark.system
def test_models_lists_them_and_ask_uses_them(home: Path, tmp_path: Path, isolated_home: Path) -> None:
    env = {"HOME": str(home)}
    listed = run_kvchat("models", "--json", home=isolated_home, env=env)
    assert listed.returncode == 0, listed.stderr
    found = {row["name"]: row for row in json.loads(listed.stdout) if row["source"] != "registry"}
    assert set(found) == {"ollama:tiny:latest", "lmstudio:pub/tiny-GGUF/tiny-Q8_0.gguf", "hf:acme/Tiny-GGUF:tiny-Q4_K_M.gguf",
                          "hf:acme/Tiny-GGUF:tiny-Q8_0.gguf"}
    assert found["hf:acme/Tiny-GGUF:tiny-Q8_0.gguf"]["source"] == "huggingface"
    tiny = found["ollama:tiny:latest"]
    assert (tiny["source"], tiny["architecture"], tiny["context"], tiny["draft"]) == ("ollama", "qwen2", 4096, None)
    with LlamaModel(home / f".ollama/models/blobs/sha256-{OLLAMA_HEX}") as model:
        assert tiny["kv_bytes_per_token"] == model.shape.kv_bytes_per_token() > 0
    document = tmp_path / "notes.txt"
    document.write_text("The boat was named the Grey Heron. " * 20)
    asked = run_kvchat("ask", str(document), "What was the boat called?", "-m", "ollama:tiny", "-n", "4", "--json",
                       home=isolated_home, env=env)
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout)["model"] == "ollama:tiny"
    missing = run_kvchat("ask", str(document), "Who?", "-m", "ollama:qwen2.5", home=isolated_home, env=env)
    assert missing.returncode == 1 and missing.stderr.strip().endswith("(hint: ollama pull qwen2.5:latest)")


def test_a_draft_is_paired_by_vocabulary_and_remembered(tmp_path: Path, tiny_model_path: Path, monkeypatch) -> None:
    """An installed registry model that is smaller and spells every token alike drafts; one with
    another vocabulary does not. (Tiny GGUFs of another seed share the tiny vocabulary.)"""
    small = write_tiny_gguf(tmp_path / "small-draft.gguf", seed=5)
    entry = type("Entry", (), {"name": "tiny-draft", "size": 1})()
    monkeypatch.setattr(drafts, "REGISTRY", (entry,))
    monkeypatch.setattr(drafts, "model_status", lambda _entry: type("Status", (), {"packages_installed": True})())
    real_resolve = drafts.resolve_model
    monkeypatch.setattr(drafts, "resolve_model", lambda name: small if name == "tiny-draft" else real_resolve(name))
    assert drafts.paired_draft(str(tiny_model_path)) == "tiny-draft"
    remembered = json.loads((drafts.cache_dir() / drafts.MEMO_NAME).read_text())
    assert list(remembered.values()) == ["tiny-draft"]
    monkeypatch.setattr(drafts, "_same_vocabulary", lambda *_: pytest.fail("asked again"))
    assert drafts.paired_draft(str(tiny_model_path)) == "tiny-draft"  # from the memo


def test_no_draft_of_another_vocabulary(tiny_model_path: Path, small_model_path: Path, monkeypatch) -> None:
    entry = type("Entry", (), {"name": "other-vocabulary", "size": 1})()
    monkeypatch.setattr(drafts, "REGISTRY", (entry,))
    monkeypatch.setattr(drafts, "model_status", lambda _entry: type("Status", (), {"packages_installed": True})())
    real_resolve = drafts.resolve_model
    monkeypatch.setattr(drafts, "resolve_model", lambda name: small_model_path if name == "other-vocabulary" else real_resolve(name))
    assert drafts.paired_draft(str(tiny_model_path)) is None
    assert list(json.loads((drafts.cache_dir() / drafts.MEMO_NAME).read_text()).values()) == [""]


@pytest.mark.system
def test_a_model_whose_chat_template_is_not_utf8_is_listed_with_why_and_refused_in_one_line(
    home: Path, tmp_path: Path, isolated_home: Path
) -> None:
    """`kvchat models` lists such a file with why it cannot be used beside the store's others, and
    ask and inspect with it are refused in one line."""
    damaged = home / ".lmstudio" / "models" / "pub" / "damaged-GGUF" / "damaged-Q8_0.gguf"
    damaged.parent.mkdir(parents=True)
    write_tiny_gguf(damaged, chat_template=CHATML_TEMPLATE.encode().replace(b"assistant", b"assist\xff\xfent"))
    env = {"HOME": str(home)}
    listed = run_kvchat("models", "--json", home=isolated_home, env=env)
    assert listed.returncode == 0, listed.stderr
    found = {row["name"]: row for row in json.loads(listed.stdout) if row["source"] != "registry"}
    refusal = f"{damaged}: its chat template (tokenizer.chat_template) is not UTF-8 (byte 177)"
    assert found["lmstudio:pub/damaged-GGUF/damaged-Q8_0.gguf"]["error"] == refusal
    assert found["ollama:tiny:latest"]["context"] == 4096 and "error" not in found["ollama:tiny:latest"]
    table = run_kvchat("models", home=isolated_home, env={**env, "COLUMNS": "400"})
    row = next(line for line in table.stdout.splitlines() if "damaged-GGUF" in line)
    assert table.returncode == 0 and "is not UTF-8" in row and "ollama:tiny:latest" in table.stdout, table.stderr
    document = tmp_path / "notes.txt"
    document.write_text("The boat was named the Grey Heron. " * 20)
    hint = " (hint: use another GGUF of the model: this one was written damaged)\n"
    for command in (["ask", str(document), "Who?"], ["inspect", str(document)]):
        refused = run_kvchat(*command, "-m", "lmstudio:pub/damaged-GGUF", home=isolated_home, env=env)
        assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", f"kvchat: error: {refusal}{hint}")
