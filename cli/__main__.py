"""`python -m kvchat.cli` runs the same app as the `kvchat` command."""

from kvchat.cli.app import main

main()
