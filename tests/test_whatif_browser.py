"""The "What if: a GPU" tab in Chromium (issue #38): with no run at all (model-free mode), moving the sliders and
choosing a GPU class redraws the projection, labelled as one, with its formula and the calibration table; a batch
size out of range is refused by name, and batch size and bytes per weight redraw it (issue #60)."""
import pytest

from conftest import open_playground

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

RESULT = "document.querySelector('#whatif-result').innerText"


def test_the_what_if_tab_projects_from_sliders_with_no_run(playground, chromium):
    page = open_playground(chromium, playground)
    try:
        page.get_by_role("tab", name="What if: a GPU").click()
        page.wait_for_function(f"{RESULT}.includes('projection')", timeout=30_000)
        assert "RTX 3090" in page.locator("#whatif-result").inner_text()
        calibration = page.locator("#whatif-calibration").inner_text()
        assert all(method in calibration for method in ("PLD", "SpS", "EAGLE", "EAGLE-2"))
        box = page.locator("#whatif-k input[type=number]")
        box.fill("2")
        box.press("Enter")
        page.wait_for_function(f"{RESULT}.includes('verifies 3 rows')", timeout=30_000)
        page.click("#whatif-hardware input")
        page.locator("[role=option]", has_text="H100").first.click()
        page.wait_for_function(f"{RESULT}.includes('H100')", timeout=30_000)
        assert "E / (v(rows) + c · forwards)" in page.locator("#whatif-result").inner_text()
        batch = page.locator("#whatif-batch input[type=number]")
        batch.fill("0")
        batch.press("Enter")
        page.wait_for_function(f"{RESULT}.includes('batch size must be a whole number from 1 to 256, got 0')",
                               timeout=30_000)
        batch.fill("32")
        batch.press("Enter")
        weights = page.locator("#whatif-bytes input[type=number]")
        weights.fill("0.625")
        weights.press("Enter")
        page.wait_for_function(f"{RESULT}.includes('batch 32, 0.625 bytes a weight')", timeout=30_000)
        calibration = page.locator("#whatif-calibration").inner_text()
        assert "EAGLE-3 chain" in calibration and "predicted" in calibration and "int4" in calibration
    finally:
        page.close()
