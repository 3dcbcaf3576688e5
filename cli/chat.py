"""`kvchat chat [PATH...]`: the terminal UI for a conversation with a document, or several."""

from __future__ import annotations

from pathlib import Path

import typer

from kvchat.cli.options import MODEL, check_draft, gpu_layers_warning, with_settings
from kvchat.documents import SUPPORTED
from kvchat.engine import UserSettings, ask_settings, draft_at_start, draft_for, setting_names


@with_settings(*setting_names())
def chat_command(
    paths: list[Path] | None = typer.Argument(
        None, help=f"The document, or several to ask about together ({SUPPORTED}); a file picker opens without one.",
        show_default=False,
    ),
    model: str = MODEL,
    user: UserSettings = UserSettings(),
) -> None:
    """Chat with a document in a terminal UI (F1 inside lists the keys)."""
    settings = ask_settings(user)
    from kvchat.tui.app import KvchatApp  # Textual is imported only for this command
    from kvchat.tui.sessions import EngineSessionFactory

    check_draft(user.draft, settings.read)
    draft = draft_for(model, user.draft, settings.read)
    sessions = EngineSessionFactory(model, user.gpu_layers, user.cache, draft, draft_at_start(user.draft, settings.read))
    app = KvchatApp(sessions, paths or [], settings, startup_warning=gpu_layers_warning(user.gpu_layers))
    try:
        app.run()
    finally:
        app.close_engine()
