"""``glyd serve``'s chat page in headless Chromium (slow; skipped without Chromium or Playwright).

A prompt is typed and sent with Enter; the answer streams onto the page (several updates, the text
``generate()`` gives greedily), the header shows the layout and sizes, the footer tokens/s; a
screenshot is taken and checked (its size, the header's colour, text drawn in the answer).

Needs Debian's ``chromium`` (``apt-get install chromium``) and the ``playwright`` package (its
Python client only: the browser is Debian's, never a download).
"""

from __future__ import annotations

import shutil

import pytest
import torch

pytestmark = pytest.mark.slow

MAX = 16
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def test_chat_page_streams_an_answer(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    pytest.importorskip("fastapi")
    transformers = pytest.importorskip("transformers")
    from PIL import Image

    import glyd
    from glyd.apps.serve import ServeConfig, Server
    from glyd.store import pack_folder
    from serve_model import build_chat_model

    packed = pack_folder(build_chat_model(tmp_path / "bf16"), tmp_path / "packed", layout="fixed12",
                         progress=False).dst
    tok = transformers.AutoTokenizer.from_pretrained(packed)
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    model = glyd.from_pretrained(packed, device="cpu", progress=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=MAX, do_sample=False)[0, len(ids):]
    expected = tok.decode(out, skip_special_tokens=True)

    cfg = ServeConfig(str(packed), name="tiny", device="cpu", port=0, max_tokens=MAX, progress=False)
    with Server(cfg) as server, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 600})
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('info').textContent.includes('layout fixed12')")
            page.evaluate("""() => {
                window.updates = 0;
                new MutationObserver(() => { window.updates += 1; })
                    .observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});
            }""")
            page.fill("#prompt", "Hi there")
            page.press("#prompt", "Enter")
            page.wait_for_function("document.getElementById('stats').textContent.includes('tokens/s')", timeout=60_000)
            answer = page.text_content("#answer")
            stats = page.text_content("#stats")
            info = page.text_content("#info")
            updates = page.evaluate("window.updates")
            shot = tmp_path / "page.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    assert answer == expected and len(answer) == MAX
    assert updates >= 4  # the answer grew piece by piece, not in one block
    assert stats.startswith(f"{MAX} tokens in ") and "tokens/s" in stats
    assert "layout fixed12" in info and "KV cache bf16" in info and "MiB" in info
    img = Image.open(shot).convert("RGB")
    assert img.size == (900, 600)
    assert img.getpixel((5, 5)) == (0x1C, 0x27, 0x33)  # the header's colour
    colours = img.crop((0, 60, 900, 400)).getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 20  # text is drawn (anti-aliased glyphs), not a blank page
