"""`kvchat serve`: the OpenAI-compatible chat server."""

from __future__ import annotations

import socket
import textwrap
import webbrowser
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from kvchat.cli.options import MODEL, every_setting_but, warn_about_gpu_layers, with_settings
from kvchat.documents.limits import SERVER_DOCUMENTS_BYTES
from kvchat.engine import MOST_TOKENS, Engine, UserSettings, ask_settings, draft_for
from kvchat.errors import ModelError, SettingsError
from kvchat.llama import max_sequences
from kvchat.serving.slots import DEFAULT_ROOM

CURL_EXAMPLE = """\
curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'
"""
# The README's example, word for word (tests/server/test_server.py runs the README's copy).
PYTHON_EXAMPLE = """\
import os

from openai import OpenAI

client = OpenAI(base_url="{url}/v1", api_key=os.environ.get("KVCHAT_API_KEY", "unused"))
doc = client.post("/documents", cast_to=dict, files={{"file": open("contract.pdf", "rb")}},
                  options={{"headers": {{"Content-Type": "multipart/form-data"}}}})  # a file goes as a form
answer = client.chat.completions.create(
    model="{model}",
    messages=[{{"role": "user", "content": "What is the termination clause?"}}],
    extra_body={{"document_id": doc["id"]}},  # kvchat's extension; kv_budget and kv_method too
)
print(answer.choices[0].message.content)
"""


# What sets the size of the shared context: its sequences, and each one's cells.
SHARED_CONTEXT_HINT = "lower --max-sessions, or each sequence's cells (--budget, --room, --max-tokens)"


def _check_shared_context(sequences: int, sequence_cells: int) -> None:
    """Refuses the shared context llama.cpp could not make, before a model loads: more sequences
    than it holds in one context, or more cells than the largest context (llama.cpp counts them in
    32 bits: 8 sequences of a 2^31 budget wrapped to a context of 12,288 cells)."""
    if sequences > max_sequences():
        raise SettingsError(f"--max-sessions {sequences:,} is more than the {max_sequences()} sequences llama.cpp holds "
                            "in one context", f"lower --max-sessions to {max_sequences()} or less")
    if sequences * sequence_cells > MOST_TOKENS:
        raise SettingsError(f"{sequences:,} sequences of {sequence_cells:,} cells are {sequences * sequence_cells:,} cells, "
                            f"more than the largest context's {MOST_TOKENS:,}", SHARED_CONTEXT_HINT)


def _check_port(host: str, port: int) -> None:
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as error:
        raise SettingsError(f"cannot listen on {host}:{port} ({error.strerror})", "choose another --port or --host") from None


@with_settings(*every_setting_but(
    method="a request names its own (kv_method: snapkv or full), unset the default",
    select="each request is answered anew from its messages (a selection per question)",
    n_ctx="each conversation's cells are --budget, --room and --max-tokens",
))
def serve_command(
    host: str = typer.Option("127.0.0.1", help="Address to listen on; 0.0.0.0 exposes the server to your network."),
    port: int = typer.Option(8080, min=1, max=65535, help="Port to listen on."),
    api_key: str | None = typer.Option(None, envvar="KVCHAT_API_KEY", help="Require Authorization: Bearer KEY."),
    model: str = MODEL,
    max_sessions: int = typer.Option(8, help="Conversations held in the KV cache at once (one sequence each)."),
    max_waiting: int = typer.Option(16, help="Requests that may wait for a sequence; more get 429."),
    max_readings: int = typer.Option(2, help="Requests read at once, taking turns a chunk each (each holds a context)."),
    documents_memory: int = typer.Option(
        SERVER_DOCUMENTS_BYTES // 2**20, help="MiB of memory the uploaded documents may hold; the least recently used go first.",
    ),
    room: int = typer.Option(DEFAULT_ROOM, help="Cells per conversation for its question and earlier turns, besides the budget."),
    open_page: bool = typer.Option(False, "--open", help="Open the chat page in the default browser once serving."),
    allow_origin: list[str] = typer.Option(
        [], help="A web origin (https://app.example) whose pages may call this API from the browser; none by default."),
    user: UserSettings = UserSettings(),
) -> None:
    """Serve a chat page in the browser and an OpenAI-compatible API: chat completions, models,
    and documents to chat about. The answer settings are the defaults of a request that sets
    none (its kv_<setting> fields, its system message); --budget and --max-tokens are also the most it may ask."""
    from kvchat.server.runner import server_for
    from kvchat.server.service import ChatService, ServerLimits

    if min(max_sessions, max_waiting, max_readings, documents_memory) < 1 or room < 16:
        raise SettingsError(
            "--max-sessions, --max-waiting, --max-readings, --documents-memory must be >= 1, "
            "--room >= 16", "see kvchat serve --help",
        )
    budget, threads = user.budget, user.threads
    _check_shared_context(max_sessions, budget + room + user.max_tokens)
    layout = ask_settings(user).layout  # refuses bad settings now, as a request's would be refused: requests build theirs later
    draft = draft_for(model, user.draft, user.read)  # a named one whatever --read says: a request may read fast (kv_read)
    _check_port(host, port)
    console = Console(stderr=True)
    warn_about_gpu_layers(user.gpu_layers, console)
    engine = Engine(model, gpu_layers=user.gpu_layers, use_cache=user.cache, draft=draft)
    model_id = served_name(model, engine.model_path)
    limits = ServerLimits(model_id=model_id, budget=budget, max_tokens=user.max_tokens, sequences=max_sessions,
                          max_waiting=max_waiting, max_readings=max_readings, max_document_bytes=documents_memory * 2**20,
                          room=room, layout=layout, defaults=user)
    try:
        service = ChatService(engine, limits, threads)
    except ModelError as error:  # its hint names the context of one question (`n_ctx`), which serve does not set
        raise ModelError(error.message, f"{SHARED_CONTEXT_HINT}, free memory, or use f16 cache types "
                                          "(the log file has llama.cpp's reason)") from None
    try:
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
        shape = f"model {model}, {max_sessions} sequences of {limits.sequence_cells:,} cells, budget {budget}"
        shape += f", flash attention {'on' if layout.flash_attn else 'off'}, KV {layout.type_k}/{layout.type_v}"

        def banner() -> None:  # once the server listens
            console.print(f"kvchat serve: chat page {url}/ · API {url}/v1  ({shape})", markup=False, highlight=False,
                          soft_wrap=True)
            if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
                warning = f"WARNING: listening on {host} without --api-key: anyone on your network can use this server"
                console.print(Text(warning, style="bold red"), soft_wrap=True)
            console.print(_examples(url, model_id, api_key is not None), highlight=False, markup=False, soft_wrap=True)
            if open_page:
                webbrowser.open(f"{url}/")

        server_for(service, host, port, api_key, on_started=banner, allowed_origins=allow_origin).run()
    finally:
        service.close()


def served_name(model: str, path: Path) -> str:
    """What the API calls the model (/v1/models, /health, a request's `model`): a registry or
    store name as given; a GGUF given by its path by its file name, so that /health, which needs
    no key, tells nobody where the file lives."""
    return path.name if path == Path(model).expanduser() else model


def _examples(url: str, model: str, keyed: bool) -> str:
    """The banner's examples; with a key they read it from $KVCHAT_API_KEY (the banner never shows it)."""
    auth = ' -H "Authorization: Bearer $KVCHAT_API_KEY"' if keyed else ""
    curl = CURL_EXAMPLE.format(url=url, model=model, auth=auth)
    return textwrap.indent(curl + "\n" + PYTHON_EXAMPLE.format(url=url, model=model), "  ")
