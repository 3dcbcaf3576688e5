"""Screenshots of the chat page from a real run, for the README: `kvchat serve` on a real model,
the bundled contract uploaded through the page, one question asked, its first source opened;
light and dark. Needs Debian's chromium and playwright (the test extra).

    python bench/page_screenshots.py --model default --out docs/images
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

SAMPLE = Path(__file__).parents[1] / "kvchat" / "samples" / "marketing_reseller_agreement.pdf"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--question", default="Which law governs this agreement?")
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed: apt-get install chromium")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "kvchat.cli", "serve", "--port", str(port), "--model", args.model],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        while "chat page" not in server.stderr.readline():  # the banner: it listens
            if server.poll() is not None:
                sys.exit("kvchat serve did not start")
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"{url}/")
            page.wait_for_selector("body[data-ready=yes]")
            page.set_input_files("#file", str(SAMPLE))
            page.wait_for_selector(f"#documents li:has-text('{SAMPLE.name}') input:checked", timeout=300_000)
            page.fill("#question", args.question)
            page.click("#send")
            page.wait_for_selector("#messages li.assistant .stats", timeout=900_000)
            page.locator("#messages li.assistant .sources button").first.click()
            page.locator("#document-text mark").wait_for()
            page.screenshot(path=str(args.out / "page-light.png"))
            page.emulate_media(color_scheme="dark")
            page.screenshot(path=str(args.out / "page-dark.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"wrote {args.out / 'page-light.png'} and {args.out / 'page-dark.png'}")


if __name__ == "__main__":
    main()
