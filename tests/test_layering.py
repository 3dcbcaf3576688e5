"""The layering of docs/layout.md: policy and the llama adapter <- engine <- serving <- server, and the other
front ends (CLI, TUI, bench) on the engine's public names; one direction, and no import circle."""

from __future__ import annotations

import ast
import graphlib
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).parents[1]
PACKAGES = {
    "policy": REPO / "kvchat" / "policy",
    "llama": REPO / "kvchat" / "llama",
    "engine": REPO / "kvchat" / "engine",
    "serving": REPO / "kvchat" / "serving",
    "documents": REPO / "kvchat" / "documents",
    "models": REPO / "models",
    "cli": REPO / "cli",
    "tui": REPO / "tui",
    "server": REPO / "server",
    "bench": REPO / "kvchat" / "bench",
    "experiments": REPO / "bench",  # the research scripts, beside `kvchat bench`
}
# What each layer may import from kvchat (besides itself).
ALLOWED = {
    "policy": {"kvchat.errors"},
    "documents": {"kvchat.errors"},
    "models": {"kvchat.errors", "kvchat.paths", "kvchat.models", "kvchat.atomic"},
    "llama": {"kvchat.errors", "kvchat.llama"},
    "engine": {"kvchat.errors", "kvchat.events", "kvchat.llama", "kvchat.policy", "kvchat.documents",
               "kvchat.models", "kvchat.engine", "kvchat.paths", "kvchat.atomic"},
    "serving": {"kvchat.engine", "kvchat.events", "kvchat.documents", "kvchat.errors", "kvchat.llama"},
    "tui": {"kvchat.engine", "kvchat.events", "kvchat.documents", "kvchat.errors", "kvchat.policy"},
    "server": {"kvchat.serving", "kvchat.engine", "kvchat.events", "kvchat.documents", "kvchat.errors", "kvchat.llama",
               "kvchat.policy"},
    "bench": {"kvchat.engine", "kvchat.events", "kvchat.documents", "kvchat.policy", "kvchat.errors",
              "kvchat.atomic"},
    "experiments": {"kvchat.bench", "kvchat.engine", "kvchat.events", "kvchat.documents", "kvchat.policy", "kvchat.errors",
                    "kvchat.models"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def imports_of(package: str) -> set[str]:
    return {name for file in PACKAGES[package].rglob("*.py") for name in imported_modules(file)}


def test_only_the_adapter_imports_llama_cpp() -> None:
    sources = [file for root in ("kvchat", "cli", "tui", "server", "models", "bench") for file in (REPO / root).rglob("*.py")]
    assert len(sources) > 30
    for file in sources:
        if PACKAGES["llama"] in file.parents:
            continue
        raw = {n for n in imported_modules(file) if n == "llama_cpp" or n.startswith("llama_cpp.")}
        assert not raw, f"{file} imports {raw}"


def test_policy_is_numpy_only() -> None:
    third_party = {n.split(".")[0] for n in imports_of("policy")} - {"kvchat", "__future__"}
    assert third_party <= {"numpy", "dataclasses", "enum", "typing"}


def test_each_layer_imports_only_what_is_below_it() -> None:
    for package, allowed in ALLOWED.items():
        assert PACKAGES[package].is_dir(), f"{package}: no {PACKAGES[package]}"  # else nothing would be checked
        ours = {n for n in imports_of(package) if n.startswith("kvchat.")}
        own = f"kvchat.{package}"
        bad = {n for n in ours if not n.startswith(own) and not any(n == a or n.startswith(a + ".") for a in allowed)}
        assert not bad, f"{package} imports {bad}"


# The engine's rooms, lowest first: a module imports from its own room or one below it. Its
# top-level modules are the ground floor (the settings, the prompt, the drafts), but for the two
# that put the rooms together: a Conversation, and the Engine behind the package's front door.
ENGINE_ROOMS = ("", "kvcache", "text", "reading", "selections", "conversation", "answering", "engine")


def _engine_room(module: str) -> int:
    """The rank in ENGINE_ROOMS of `kvchat.engine.<...>`: its sub-package, or its own name at the top."""
    parts = module.split(".")[2:]
    name = parts[0] if parts else "engine"
    return ENGINE_ROOMS.index(name) if name in ENGINE_ROOMS else 0


def test_the_engines_rooms_import_only_their_own_and_those_below() -> None:
    upward = []
    for file in PACKAGES["engine"].rglob("*.py"):
        parts = file.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for name in imported_modules(file):
            if name.startswith("kvchat.engine.") and _engine_room(name) > _engine_room(module) and module != "kvchat.engine":
                upward.append(f"{module} imports {name}")
    assert upward == []


def test_front_ends_do_not_reach_into_the_adapter() -> None:
    for name in imports_of("cli") | imports_of("tui") | imports_of("serving") | imports_of("server"):
        assert not name.startswith("kvchat.llama._") and name != "llama_cpp"


def test_no_print_in_the_library() -> None:
    for package in ("policy", "llama", "engine", "serving", "documents", "models", "bench", "tui", "server"):
        for file in PACKAGES[package].rglob("*.py"):
            tree = ast.parse(file.read_text(encoding="utf-8"))
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "print"]
            assert not calls, f"print() in {file}"


def test_every_package_directory_is_installed() -> None:
    """A wheel holds only the packages pyproject lists: a new subpackage left out of the list works
    in the editable checkout and is missing from `pip install .`."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: REPO / folder for name, folder in setuptools["package-dir"].items()}
    found = set()
    for name, root in roots.items():
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            found.add(".".join((name, *relative)))
    assert found == set(setuptools["packages"])


FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _error_texts(path: Path) -> Iterator[tuple[int, str]]:
    """The string parts of every `…Error(…)` call in `path`: the messages and hints it raises."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name.endswith("Error"):
                for argument in node.args + [keyword.value for keyword in node.keywords]:
                    for part in ast.walk(argument):
                        if isinstance(part, ast.Constant) and isinstance(part.value, str):
                            yield node.lineno, part.value


def test_errors_below_the_front_ends_name_settings_never_a_front_ends_flags() -> None:
    """A hint says `n_ctx`, which the CLI shows as --n-ctx and the server as a request field (or not at all)."""
    checked = 0
    for package in ("policy", "llama", "engine", "serving", "documents"):
        for file in PACKAGES[package].rglob("*.py"):
            for line, text in _error_texts(file):
                checked += 1
                assert not FLAG.search(text), f"{file.relative_to(REPO)}:{line}: {text!r}"
    assert checked > 100


def test_each_front_end_names_a_setting_its_own_way() -> None:
    from kvchat.cli.options import flag
    from kvchat.errors import KvCacheFullError
    from kvchat.server.errors import api_error
    from kvchat.tui.messages import named_in_chat

    error = KvCacheFullError("the KV cache is full", "raise `n_ctx` or lower `max_tokens`")
    assert error.one_line() == "the KV cache is full (hint: raise n_ctx or lower max_tokens)"
    assert error.one_line(flag) == "the KV cache is full (hint: raise --n-ctx or lower --max-tokens)"
    assert error.one_line(named_in_chat) == "the KV cache is full (hint: raise --n-ctx or lower max tokens (ctrl+s))"
    assert api_error(error).message == "the KV cache is full"  # a request cannot set n_ctx: no hint
    budget = KvCacheFullError("the prompt fills the whole context", "lower `budget`")
    assert api_error(budget).message == "the prompt fills the whole context (hint: lower kv_budget)"


def test_serving_and_the_front_ends_use_the_engine_through_its_front_door() -> None:
    """They import `kvchat.engine` itself, never one of its modules, and only the names it exports:
    what they need is its public API."""
    import kvchat.engine

    public = set(kvchat.engine.__all__)
    checked = 0
    for package in ("serving", "server", "cli", "tui", "bench", "experiments"):
        for file in PACKAGES[package].rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    inner = [alias.name for alias in node.names if alias.name.startswith("kvchat.engine.")]
                    assert not inner, f"{file.relative_to(REPO)} imports {inner}"
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvchat.engine"):
                    assert node.module == "kvchat.engine", f"{file.relative_to(REPO)} imports {node.module}"
                    private = {alias.name for alias in node.names} - public
                    assert not private, f"{file.relative_to(REPO)} imports {private}, which kvchat.engine does not export"
                    checked += 1
    assert checked > 20


def kvchat_modules() -> dict[str, Path]:
    """Every module of kvchat as installed (pyproject's package-dir), by its dotted name."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {}
    for package, folder in setuptools["package-dir"].items():
        for file in (REPO / folder).rglob("*.py"):
            name = ".".join((package, *file.relative_to(REPO / folder).with_suffix("").parts))
            modules[name.removesuffix(".__init__")] = file
    return modules


def imports_within(file: Path, modules: dict[str, Path]) -> set[str]:
    """The kvchat modules `file` imports, wherever it imports them (under TYPE_CHECKING too): for
    `from package import name`, the module package.name where there is one, else the package."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                         for alias in node.names)
    return found & modules.keys()


def test_no_import_circle() -> None:
    """No kvchat module imports, through others, itself: a circle means two concepts that cannot be
    read (or tested) one without the other (a conversation that answers in parts through
    conversations was one)."""
    modules = kvchat_modules()
    assert {"kvchat.engine.conversation", "kvchat.cli.ask", "kvchat.models.registry"} <= modules.keys()
    graph = {name: imports_within(file, modules) - {name} for name, file in modules.items()}
    assert sum(map(len, graph.values())) > 300
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        raise AssertionError(f"an import circle: {' -> '.join(error.args[1])}") from None
