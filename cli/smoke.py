"""The smoke test's child process (`python -m kvchat.cli.smoke MODEL [GPU_LAYERS]`), started by
`kvchat doctor`: each step's name on a line before it starts, then the result as one JSON line.
A native crash kills only this process; the doctor reads the last step it named."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvchat.cli.logs import configure_logging
from kvchat.cli.options import flag
from kvchat.engine import smoke_test
from kvchat.errors import KvchatError

STAGE_PREFIX = "stage: "


def main() -> None:
    configure_logging()
    model, gpu_layers = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0
    try:
        result = smoke_test(model, gpu_layers, stage=lambda name: print(STAGE_PREFIX + name, flush=True))
    except KvchatError as error:
        print(error.one_line(flag), file=sys.stderr)
        sys.exit(error.exit_code)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
