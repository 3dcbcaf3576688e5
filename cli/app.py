"""The `kvchat` command. Errors from every command are translated here, and only here."""

from __future__ import annotations

import sys

import click
import typer

from kvchat.cli.ask import ask_command
from kvchat.cli.bench import bench_command
from kvchat.cli.cache import cache_app
from kvchat.cli.chat import chat_command
from kvchat.cli.logs import configure_logging
from kvchat.cli.models import models_command
from kvchat.cli.serve import serve_command
from kvchat.errors import CancelledError, KvchatError

app = typer.Typer(
    name="kvchat",
    help="Chat with long documents on your own machine, with a KV cache that stays small.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("ask")(ask_command)
app.command("chat")(chat_command)
app.command("models")(models_command)
app.command("bench")(bench_command)
app.command("serve")(serve_command)
app.add_typer(cache_app, name="cache")

EXIT_INTERRUPTED = 130


def main() -> None:
    """Entry point: run the app; one line on stderr and a non-zero exit for every failure."""
    configure_logging()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=sys.argv[1:], prog_name="kvchat", standalone_mode=False)
    except CancelledError:
        code = EXIT_INTERRUPTED
    except KvchatError as error:
        sys.stdout.flush()
        print(f"kvchat: error: {error.one_line()}", file=sys.stderr)
        sys.exit(error.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        code = EXIT_INTERRUPTED
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    if code == EXIT_INTERRUPTED:  # Typer turns Ctrl-C into a silent Exit(130)
        print("kvchat: stopped", file=sys.stderr)
    sys.exit(code if isinstance(code, int) else 0)
