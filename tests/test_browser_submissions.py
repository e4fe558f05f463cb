"""The physicist's path in a real browser (Debian's Chromium, Playwright) against a live server and
a real worker driving the simulated library: submit 200 paths on the form, follow the
submission's bar and the estimated range for the rest while its files are planned and read,
see it finish, download the list of restored files with their disk paths."""
import re
import time

import pytest

from carousel.models import Control, RestoreRequest
from tests.live import carousel, open_dir  # noqa: F401 (fixtures)

from .test_browser import SHOTS, browser, log_in, nav  # noqa: F401 (fixtures)

FILES = 200


@pytest.fixture
def open_page(browser, carousel):  # noqa: F811
    contexts = []

    def open_page(width=1280, height=900):
        context = browser.new_context(viewport={"width": width, "height": height}, base_url=carousel.url,
                                      accept_downloads=True)
        context.set_default_timeout(30_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def shot(page, name):
    page.screenshot(path=str(SHOTS / f"{name}.png"))  # what a screen shows: the submission on top


def card_now(page):
    """(steps shown under the bar, the estimate's text) of the submission on the page, reloaded."""
    page.reload()
    card = page.locator("article.submission").first
    return card.locator(".steps").inner_text(), card.get_by_test_id("estimate").inner_text()


def test_a_physicist_follows_a_submission_of_200_files_to_the_end(open_page, carousel, alice):  # noqa: F811
    paths = [f"/star/run9/st_physics_{i:04d}.daq" for i in range(FILES)]
    for path in paths:
        carousel.tape(path, path.encode())
    # Two drives, each with its mount and the next planned, ten files a job: the files wait
    # planned and are read for a while, not all at once.
    Control.objects.filter(id=1).update(files_per_job=10, jobs_in_flight=4, drives=2)
    page = open_page()
    log_in(page, "alice")
    nav(page, "Restore")
    page.get_by_label("Paths, one per line").fill("\n".join(paths))
    page.get_by_role("button", name="Submit").click()
    page.get_by_text(f"Submitted {FILES} file(s)").wait_for()
    page.locator("article.submission .progress").wait_for()

    # While some are back and others planned or read, the page gives a range for the rest.
    seen = set()
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and not {"planned", "being read"} <= seen:
        carousel.check_worker()
        steps, estimate = card_now(page)
        if "restored" in steps and re.match(r"the rest (about|not before) \d\d:\d\d", estimate):
            for step in ("planned", "being read"):
                if re.search(rf"\d+ {step}", steps) and step not in seen:
                    seen.add(step)
                    shot(page, f"submission-{step.replace(' ', '-')}")
        time.sleep(0.2)
    assert seen == {"planned", "being read"}, f"a range was seen only while files were {seen}"

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        steps, estimate = card_now(page)
        if estimate.startswith("finished"):
            break
        time.sleep(0.5)
    assert steps.strip() == f"{FILES} restored" and re.match(r"finished: the first file back at \d\d:\d\d", estimate)
    shot(page, "submission-finished")

    with page.expect_download() as download:
        page.get_by_role("link", name="text").first.click()
    lines = download.value.path().read_text().splitlines()
    assert sorted(line.split("\t")[:2] for line in lines) == sorted(
        [p, f"on disk at {carousel.disk}{p}"] for p in paths)
    assert RestoreRequest.objects.filter(state="done").count() == FILES

    nav(page, "My requests")
    page.get_by_role("heading", name="My submissions").wait_for()
    shot(page, "submissions")
