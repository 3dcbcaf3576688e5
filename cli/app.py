"""The `kvchat` command. Errors from every command are translated here, and only here."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import NoReturn

import typer

from kvchat.cli.ask import ask_command
from kvchat.cli.bench import bench_command
from kvchat.cli.cache import cache_app
from kvchat.cli.chat import chat_command
from kvchat.cli.config import config_command, default_map, with_source
from kvchat.cli.doctor import doctor_command
from kvchat.cli.inspect import inspect_command
from kvchat.cli.logs import configure_logging
from kvchat.cli.options import flag
from kvchat.cli.models import models_command
from kvchat.cli.read import read_command
from kvchat.cli.resident import resident_command
from kvchat.cli.serve import serve_command
from kvchat.errors import CancelledError, KvchatError
from kvchat.paths import as_home_error

app = typer.Typer(
    name="kvchat",
    help="Chat with long documents on your own machine, with a KV cache that stays small.",
    add_completion=True,  # --install-completion for bash, zsh, fish, PowerShell
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(shown: bool) -> None:
    if shown:
        from importlib.metadata import version  # here: 30 ms to import, for --version alone

        typer.echo(f"kvchat {version('kvchat')} (llama-cpp-python {version('llama-cpp-python')})")
        raise typer.Exit()


@app.callback()
def _kvchat(
    _version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """Chat with long documents on your own machine, with a KV cache that stays small."""
app.command("ask")(ask_command)
app.command("chat")(chat_command)
app.command("read")(read_command)
app.command("inspect")(inspect_command)
app.command("models")(models_command)
app.command("bench")(bench_command)
app.command("serve")(serve_command)
app.command("doctor")(doctor_command)
app.command("config")(config_command)
app.command("resident", hidden=True)(resident_command)  # what `kvchat ask` leaves to keep its model loaded
app.add_typer(cache_app, name="cache")


def _reflow(typer_app: typer.Typer) -> None:
    """Each command's help from its docstring as prose, its paragraphs' line breaks taken out, so
    that the help is wrapped to the terminal's width rather than where the source's lines end."""
    for command in typer_app.registered_commands:
        doc = command.help or inspect.getdoc(command.callback) or ""
        command.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        _reflow(group.typer_instance)


_reflow(app)

EXIT_INTERRUPTED = 130

# The click that typer runs on, found through typer's own export: typer 0.29 ships a copy of click
# (typer._click) whose exceptions are not the installed click's, so `import click` would catch nothing.
_click_errors = importlib.import_module(typer.BadParameter.__module__)


def main() -> None:
    """Entry point: run the app; one line on stderr and a non-zero exit for every failure."""
    command = typer.main.get_command(app)
    try:
        configure_logging()
        code = command.main(args=sys.argv[1:], prog_name="kvchat", standalone_mode=False, default_map=default_map(command))
    except CancelledError:
        code = EXIT_INTERRUPTED
    except KvchatError as error:
        _fail(error.one_line(flag), error.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        code = EXIT_INTERRUPTED
    except OSError as error:  # a write in kvchat's folders that no check foresaw: one line too
        unusable = as_home_error(error)
        if unusable is None:
            raise
        _fail(unusable.one_line(flag), unusable.exit_code)
    except _click_errors.NoArgsIsHelpError as error:  # `kvchat`, `kvchat cache`: the help, exit 2 as click does
        error.show()
        sys.exit(error.exit_code)
    except _click_errors.ClickException as error:  # usage errors: bad value, missing argument, unknown option
        message, hint = with_source(error) or (error.format_message(), f"see {_command_path(command, sys.argv[1:])} --help")
        _fail(KvchatError(message, hint).one_line(), error.exit_code)
    if code == EXIT_INTERRUPTED:  # Typer turns Ctrl-C into a silent Exit(130)
        print("kvchat: stopped", file=sys.stderr)
    sys.exit(code if isinstance(code, int) else 0)


def _command_path(command: object, args: list[str]) -> str:
    """`kvchat cache clear` for `cache clear --bad`: click leaves no context on some parse errors."""
    path = ["kvchat"]
    for arg in args:
        subcommands = getattr(command, "commands", {})
        if arg not in subcommands:
            break
        command = subcommands[arg]
        path.append(arg)
    return " ".join(path)


def _fail(line: str, exit_code: int) -> NoReturn:
    sys.stdout.flush()
    print(f"kvchat: error: {line}", file=sys.stderr)
    sys.exit(exit_code)
