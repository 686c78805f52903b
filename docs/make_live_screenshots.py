"""Screenshots of the live app (`selfattn serve`), one PNG per screen, in docs/.

    .venv/bin/python docs/make_live_screenshots.py                        # every screenshot
    .venv/bin/python docs/make_live_screenshots.py live-generate.png      # only those named

It starts `selfattn serve --port 0 --no-browser` as a user would, drives Debian's Chromium
(headless, through Playwright, with the browser tests' arguments) at 1280 x 800, stops the
server with Ctrl-C (SIGINT) and writes:

    live-walkthrough.png   the seed's walkthrough, the query "sat"
    live-attention.png     stories260K, a story sentence, layer 1, head 5
    live-generate.png      stories260K, "Once upon a time", after 8 steps
    live-knockout.png      two heads knocked out: the generation before and after
    live-chat.png          SmolLM2-135M-Instruct in chat mode, two questions answered
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "tests"))

from browser import CHROMIUM, CHROMIUM_ARGS, missing_browser
from live_server import live_server

VIEWPORT = {"width": 1280, "height": 800}
IDLE = "body[data-pending='0']"
MAX_BYTES = 400_000  # each PNG stays under this


def idle(page) -> None:
    page.wait_for_selector(IDLE, state="attached", timeout=60_000)


def fresh(page, url: str) -> None:
    page.goto(url)
    idle(page)
    page.wait_for_selector("[data-testid=model-select] option[value='stories260K']", state="attached")


def scroll_to(page, selector: str, margin: int = 8) -> None:
    """Scroll the window so that ``selector``'s top sits ``margin`` px below the top edge."""
    page.locator(selector).first.evaluate(
        "(el, margin) => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - margin)", margin
    )


def walkthrough(page, url: str) -> None:
    fresh(page, url)
    page.locator("[data-testid=walk-tokens] button", has_text=re.compile(r"^sat")).click()
    idle(page)


def attention(page, url: str) -> None:
    fresh(page, url)
    page.click("[data-testid=tab-attention]")
    page.select_option("[data-testid=model-select]", "stories260K")
    page.fill("[data-testid=text-input]", "Once upon a time, there was a little cat. The cat was happy.")
    page.select_option("[data-testid=layer-select]", "1")
    page.select_option("[data-testid=head-select]", "5")
    page.click("[data-testid=run]")
    idle(page)
    page.click("[data-testid=attention-grid] .row-label[data-row='17']")  # "happy"
    page.mouse.move(0, 0)
    scroll_to(page, "#tabs")


def generation(page, url: str, prompt: str, steps: int) -> None:
    fresh(page, url)
    page.click("[data-testid=tab-generate]")
    page.select_option("[data-testid=model-select]", "stories260K")
    page.fill("[data-testid=prompt-input]", prompt)
    for _ in range(steps):
        page.click("[data-testid=generate-step]")
        idle(page)


def generate(page, url: str) -> None:
    generation(page, url, "Once upon a time", 8)
    page.select_option("[data-testid=cache-layer]", "1")
    page.select_option("[data-testid=cache-head]", "5")
    scroll_to(page, "#tabs")


def knockout(page, url: str) -> None:
    generation(page, url, "Tim had a red ball. He gave the ball to", 8)
    for layer, head in ((2, 6), (3, 4)):
        page.check(f"[data-testid=ablate-heads] input[data-layer='{layer}'][data-head='{head}']")
        idle(page)
    scroll_to(page, "#tabs")


def chat(page, url: str) -> None:
    fresh(page, url)
    page.click("[data-testid=tab-generate]")
    page.select_option("[data-testid=model-select]", "SmolLM2-135M-Instruct")
    page.check("[data-testid=chat-mode]")
    page.fill("[data-testid=generate-count]", "16")
    for message in ("What is the capital of France?", "And of Italy?"):
        page.fill("[data-testid=prompt-input]", message)
        page.click("[data-testid=generate-run]")
        idle(page)
    page.select_option("[data-testid=cache-layer]", "18")
    page.select_option("[data-testid=cache-head]", "6")
    scroll_to(page, "#tabs")


SCREENS = {
    "live-walkthrough.png": walkthrough,
    "live-attention.png": attention,
    "live-generate.png": generate,
    "live-knockout.png": knockout,
    "live-chat.png": chat,
}


def small_png(data: bytes) -> bytes:
    """The screenshot with its colours cut to a palette where that makes it much smaller."""
    try:
        from PIL import Image
    except ImportError:
        return data
    image = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, "PNG", optimize=True)
    return out.getvalue() if len(out.getvalue()) < len(data) else data


def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(SCREENS))
    if unknown:
        raise SystemExit(f"no screenshot {unknown[0]!r}; they are {', '.join(SCREENS)}")
    reason = missing_browser()
    if reason:
        raise SystemExit(reason)
    from playwright.sync_api import sync_playwright

    with live_server() as server:
        url = server.url
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                for name, drive in SCREENS.items():
                    if names and name not in names:
                        continue
                    context = browser.new_context(viewport=VIEWPORT)
                    page = context.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
                    drive(page, url)
                    message = page.locator("[data-testid=error]")
                    if message.is_visible():
                        errors.append(message.text_content())
                    if errors:
                        raise SystemExit(f"{name}: {errors[0]}")
                    data = small_png(page.screenshot())
                    context.close()
                    (DOCS / name).write_bytes(data)
                    flag = "" if len(data) < MAX_BYTES else f"  (over {MAX_BYTES} bytes)"
                    print(f"wrote docs/{name}: {len(data)} bytes{flag}")
            finally:
                browser.close()


if __name__ == "__main__":
    main(sys.argv[1:])
