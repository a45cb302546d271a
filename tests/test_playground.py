"""The /playground page: served only when enabled, self-contained, and (with Debian's chromium) driven
end to end in a headless browser against the loopback simulator."""

from __future__ import annotations

import itertools
import math
import random
import re
from pathlib import Path

import aiohttp
import pytest

import tests.e2e as e2e
from gateway.config import parse_config
from gateway.inspect_view import Fragment, format_probability, lay_out, quoted
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.tokens import Token
from gateway.playground import _ASSETS
from tests.e2e import LOGPROBS, start_stack

STATIC = Path(__file__).resolve().parents[1] / "gateway" / "playground" / "static"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAVE = "👋"  # the demo tokenizer splits it into four one-byte tokens: f0 9f 91 8b


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@pytest.fixture
def playground_enabled(monkeypatch):
    """start_stack's gateway config, with `playground: true` added."""
    monkeypatch.setattr(e2e, "parse_config", lambda data, base_dir: parse_config({**data, "playground": True},
                                                                                 base_dir))


async def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, allow_redirects=False) as reply:
        return reply.status, dict(reply.headers), await reply.read()


# --- serving ----------------------------------------------------------------------------------


async def test_playground_is_off_unless_the_config_turns_it_on(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    status, _, _ = await _get(stack.url("/playground"))
    assert status == 404
    assert parse_config({"upstreams": {}, "models": {}}, Path(".")).playground is False


async def test_playground_page_and_assets_are_served_with_a_same_origin_only_policy(
        aiohttp_server, vocab, playground_enabled):
    stack = await start_stack(aiohttp_server, vocab)
    status, headers, page = await _get(stack.url("/playground"))
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy
    for name, content_type in _ASSETS.items():
        assert f'"playground/static/{name}"'.encode() in page
        status, headers, body = await _get(stack.url(f"/playground/static/{name}"))
        assert status == 200 and headers["Content-Type"] == content_type
        assert body == (STATIC / name).read_bytes()
    assert (await _get(stack.url("/playground/static/index.html")))[0] == 404
    assert (await _get(stack.url("/playground/static/..%2f__init__.py")))[0] == 404
    status, headers, _ = await _get(stack.url("/playground/"))
    assert status == 302 and headers["Location"] == "../playground"


def test_playground_files_load_nothing_from_the_network():
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(", text), path.name
    assert sorted(p.name for p in STATIC.iterdir()) == sorted(["index.html", *_ASSETS])


# --- in a browser --------------------------------------------------------------------------------


@pytest.fixture
async def browser(tmp_path):
    """A headless Debian chromium with a fresh profile, driven by Playwright (no `playwright install`)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium) for browser tests")
    async_api = pytest.importorskip("playwright.async_api", reason="the `playwright` package is not installed")
    async with async_api.async_playwright() as driver:
        context = await driver.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1280, "height": 860}, reduced_motion="reduce")
        context.set_default_timeout(30_000)  # generous: CI machines are small and may be busy
        try:
            yield context
        finally:
            await context.close()


class _Watch:
    """Everything the page asked for and every error it logged."""

    def __init__(self, page) -> None:
        self.urls: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))


async def _open(context, stack):
    page = await context.new_page()
    watch = _Watch(page)
    await page.goto(stack.url("/playground"))
    # Selectors only: the page's CSP forbids eval, which Playwright's wait_for_function polling needs.
    await page.wait_for_selector("body[data-state='idle']", state="attached")
    assert await page.locator("#model option").all_inner_texts() == [stack.model]
    return page, watch


async def _stream(page, prompt: str, top_logprobs: int, max_tokens: int, *, watch_it_stream: bool = False) -> None:
    await page.fill("#input", prompt)
    await page.fill("#top-logprobs", str(top_logprobs))
    await page.fill("#max-output-tokens", str(max_tokens))
    await page.click("#send")
    if watch_it_stream:  # tokens are drawn while the response is still streaming
        await page.locator("#tokens .tok").nth(2).wait_for()
        assert await page.get_attribute("#status", "data-kind") == "busy"
    await page.wait_for_selector("#status[data-kind='done'], #status[data-kind='error']")
    assert await page.get_attribute("#status", "data-kind") == "done", await page.inner_text("#status")


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _alternative_rows(entry) -> list[str]:
    return [f"{rank}.{quoted(bytes(alt.bytes))}{format_probability(math.exp(alt.logprob))}"
            for rank, alt in enumerate(entry.top_logprobs, 1)]


async def test_playground_streams_a_split_emoji_and_explains_each_token_in_a_browser(
        aiohttp_server, vocab, playground_enabled, browser):
    stack = await start_stack(aiohttp_server, vocab, step_delay_ms=60)
    reference = await stack.client.responses.create(model=stack.model, input="hi", include=LOGPROBS, top_logprobs=3,
                                                    max_output_tokens=64)
    entries = reference.output[0].content[0].logprobs
    wave = [i for i, e in enumerate(entries) if bytes(e.bytes) in (b"\xf0", b"\x9f", b"\x91", b"\x8b")][:4]
    assert [bytes(entries[i].bytes) for i in wave] == [b"\xf0", b"\x9f", b"\x91", b"\x8b"]

    page, watch = await _open(browser, stack)
    await _stream(page, "hi", top_logprobs=3, max_tokens=64, watch_it_stream=True)

    # Every token, in order, with its exact bytes: whole characters as text, split ones as byte chips.
    tokens = page.locator("#tokens .tok")
    assert await tokens.count() == len(entries)
    group = page.locator("#tokens .split", has=page.locator(f'.tok[data-index="{wave[0]}"]'))
    assert await group.get_attribute("aria-label") == f"“{WAVE}” split across 4 tokens"
    assert await group.locator(".tok .byte").all_inner_texts() == ["f0", "9f", "91", "8b"]
    assert await group.locator(".joined").inner_text() == WAVE
    assert await tokens.nth(0).inner_text() == entries[0].token
    whole = await page.locator("#tokens .tok:not(:has(.byte))").evaluate_all("els => els.map(e => e.textContent)")
    assert whole == [e.token for e in entries if _decodes(bytes(e.bytes))]

    # Keyboard: one tab stop, arrow keys walk the tokens, the tooltip follows focus, Escape closes it.
    await tokens.nth(0).focus()
    for _ in range(wave[1]):
        await page.keyboard.press("ArrowRight")
    second = entries[wave[1]]
    assert await page.evaluate("document.activeElement.dataset.index") == str(wave[1])
    tooltip = page.locator("#tooltip")
    assert await tooltip.is_visible()
    assert await tooltip.locator(".tt-token").inner_text() == "'\\x9f'"
    assert f"Part 2 of 4 of “{WAVE}” (f0 9f 91 8b)" in await tooltip.inner_text()
    assert re.search(r"bytes\s+9f\s+\[159\]", await tooltip.inner_text())
    rows = [re.sub(r"\s+", "", row) for row in await tooltip.locator(".tt-alts li").all_inner_texts()]
    assert rows == [re.sub(r"\s+", "", row) for row in _alternative_rows(second)]
    await page.keyboard.press("Escape")
    assert await tooltip.is_hidden()
    assert await page.evaluate("document.activeElement.dataset.index") == str(wave[1])

    # Hover shows another token's alternatives.
    await tokens.nth(0).hover()
    await page.wait_for_selector("#tooltip:not([hidden])")
    assert await tooltip.locator(".tt-token").inner_text() == quoted(bytes(entries[0].bytes))
    chosen = tooltip.locator(".tt-alts li.chosen")
    assert re.sub(r"\s+", "", (await chosen.inner_text()).replace("(sampled)", "")) == re.sub(
        r"\s+", "", _alternative_rows(entries[0])[0])

    # Summary: total logprob, perplexity, and the least confident token first.
    logprobs = [e.logprob for e in entries]
    total = math.fsum(logprobs)
    assert await page.inner_text("#sum-count") == str(len(entries))
    assert await page.inner_text("#sum-total") == f"{total:.4f}".replace("-", "−")
    assert await page.inner_text("#sum-perplexity") == f"{math.exp(-total / len(entries)):.3f}"
    least = min(range(len(entries)), key=lambda i: (logprobs[i], i))
    assert await page.get_attribute("#least li:first-child button", "data-index") == str(least)
    await page.click("#least li:first-child button")
    assert await page.evaluate("document.activeElement.dataset.index") == str(least)
    assert WAVE in await page.inner_text("#sum-splits")

    # Desktop screenshot with the tooltip open on the split emoji.
    await tokens.nth(wave[1]).focus()
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "playground-desktop.png"))

    # Phone width: nothing overflows sideways; the tooltip becomes a sheet at the bottom.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.keyboard.press("Escape")
    await page.screenshot(path=str(ARTIFACTS / "playground-phone-full.png"), full_page=True)
    await tokens.nth(wave[0]).focus()
    await page.keyboard.press("ArrowRight")  # a fresh focus on the split emoji's second byte
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    box = await tooltip.bounding_box()
    assert box is not None and box["width"] == pytest.approx(390, abs=1) and box["y"] + box["height"] == pytest.approx(
        844, abs=1)
    token_box = await tokens.nth(wave[1]).bounding_box()
    assert token_box is not None and token_box["y"] >= 0 and token_box["y"] + token_box["height"] <= box["y"]
    await page.screenshot(path=str(ARTIFACTS / "playground-phone.png"))

    assert not watch.errors
    origin = stack.url("/")
    assert watch.urls and all(url.startswith(origin) for url in watch.urls), watch.urls


async def test_playground_marks_a_character_cut_by_the_token_limit_as_incomplete(
        aiohttp_server, vocab, playground_enabled, browser):
    stack = await start_stack(aiohttp_server, vocab)
    page, watch = await _open(browser, stack)
    await _stream(page, "hi", top_logprobs=2, max_tokens=6)  # "Hi there " and then f0 9f of the emoji
    assert "incomplete (max_output_tokens)" in await page.inner_text("#sum-finish")
    cut = page.locator("#tokens .split.incomplete")
    assert await cut.locator(".byte").all_inner_texts() == ["f0", "9f"]
    assert await cut.locator(".joined.incomplete").inner_text() == "incomplete"
    assert await page.locator("#tokens .tok").count() == 6
    await page.locator("#tokens .tok").last.focus()
    assert "that form no complete character" in await page.inner_text("#tooltip")
    assert not watch.errors


async def test_playground_shows_the_gateway_error_for_a_bad_request(aiohttp_server, vocab, playground_enabled,
                                                                    browser):
    stack = await start_stack(aiohttp_server, vocab)
    page, _ = await _open(browser, stack)
    await page.click(".more summary")
    await page.fill("#extra", '{"temperature": "hot"}')
    await page.click("#send")
    await page.wait_for_selector("#status[data-kind='error']")
    assert "temperature" in await page.inner_text("#status")
    await page.fill("#extra", "[1]")
    await page.click("#send")
    await page.wait_for_selector("#status:has-text('JSON object')")
    assert await page.locator("#tokens .tok").count() == 0


def _random_cases(count: int, seed: int = 9) -> list[list[bytes]]:
    """Text with emoji, CJK, controls and stray bytes, cut into tokens at random byte offsets."""
    rng = random.Random(seed)
    alphabet = ["a", " ", "\n", "\x1b", "é", "根", "据", "👋", "🦀", "👨\u200d👩", "\\", "'"]
    cases = []
    for _ in range(count):
        data = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))).encode()
        if rng.random() < 0.3:
            data += bytes(rng.choice([0xF0, 0x9F, 0xE6, 0xFF, 0x80]) for _ in range(rng.randint(1, 3)))
        cuts = sorted(rng.sample(range(1, len(data)), k=rng.randint(0, len(data) - 1))) if len(data) > 1 else []
        bounds = [0, *cuts, len(data)]
        cases.append([data[a:b] for a, b in itertools.pairwise(bounds) if b > a])
    return cases


def _python_layout(tokens: list[bytes]) -> list[dict]:
    layouts, _ = lay_out([Token(data, -1.0) for data in tokens])
    return [{"group": layout.group,
             "pieces": [piece if not isinstance(piece, Fragment) else
                        {"bytes": list(piece.data), "char": piece.character, "closes": piece.closes}
                        for piece in layout.pieces]} for layout in layouts]


async def test_browser_and_terminal_views_lay_out_split_characters_alike(aiohttp_server, vocab, playground_enabled,
                                                                         browser):
    stack = await start_stack(aiohttp_server, vocab)
    page, watch = await _open(browser, stack)
    cases = _random_cases(400)
    as_lists = [[list(data) for data in case] for case in cases]
    in_browser = await page.evaluate("cases => cases.map(c => window.logprobPlayground.layOut(c))", as_lists)
    assert in_browser == [_python_layout(case) for case in cases]
    quoted_in_browser = await page.evaluate("cases => cases.map(c => window.logprobPlayground.quoted(c.flat()))",
                                            as_lists)
    assert quoted_in_browser == [quoted(b"".join(case)) for case in cases]
    assert not watch.errors
