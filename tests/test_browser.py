"""The pages in a real browser: Debian's Chromium driven by Playwright against a live server,
the loop run by a real Celery worker. Screenshots of each page are kept under
test-artifacts/screenshots/."""
import time
from pathlib import Path

import pytest

from carousel.models import Control, RestoreRequest
from carousel.ops import usage

from .test_shares import today  # noqa: F401 - today's mounts, shared between alice and charlie
from .test_worker import worker  # noqa: F401 - the same real worker, with beat inside

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync", "--disable-quic"]
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (`make services` does)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API keeps an event loop running in this thread, and Django refuses
    # database calls from a thread with a running loop unless told they are safe here.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with playwright.sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            yield chromium
            chromium.close()


@pytest.fixture
def open_page(browser, live_server):
    contexts = []

    def open_page(width=1280, height=800):
        context = browser.new_context(viewport={"width": width, "height": height}, base_url=live_server.url)
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def log_in(page, username):
    page.goto("/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(f"{username}-pw")
    page.get_by_label("Password").press("Enter")
    page.get_by_role("heading", name="My restore requests").wait_for()


def nav(page, name):
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name).click()


def shot(page, name):
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def fits(page, width):
    return page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.long(19)
def test_a_physicist_restores_files_watches_them_staged_and_cancels_one(open_page, worker, alice):  # noqa: F811
    Control.objects.update_or_create(id=1, defaults={"cycle_s": 0.5, "paused": True})
    page = open_page()
    log_in(page, "alice")

    # Restore through the form: every field found by its label, submitted from the keyboard.
    nav(page, "Restore")
    page.get_by_label("Paths, one per line").fill("/star/raw/f1.daq\n/star/raw/f2.daq\n\n/star/raw/f3.daq\n"
                                                  "/star/raw/unwanted.daq\n")
    page.get_by_label("Destination directory (optional)").fill("")
    page.get_by_label("E-mail me when the whole submission is finished").check()
    shot(page, "restore-form")
    page.get_by_role("button", name="Submit").focus()
    page.keyboard.press("Enter")
    page.get_by_text("Submitted 4 file(s): 4 new request(s) queued.").wait_for()

    # While submission is paused, the page says why the files wait.
    # A cycle locates them meanwhile; how soon depends on the machine's load (CI once took longer
    # than a fixed 1.5 s), so reload until it has, within a generous bound.
    paused = page.get_by_text("submission to the stager is paused by the operators")
    deadline = time.monotonic() + 60
    while True:
        page.reload()
        if paused.count() >= 1 or time.monotonic() > deadline:
            break
        page.wait_for_timeout(500)
    assert paused.count() >= 1
    shot(page, "my-requests-waiting")

    # Cancel one with its own button.
    page.get_by_role("button", name="Cancel /star/raw/unwanted.daq").click()
    page.get_by_text("1 request(s) cancelled.").wait_for()

    # The live page shows her queue, then, without a reload, the files restored.
    live = open_page()
    log_in(live, "alice")
    nav(live, "Live staging")
    live.get_by_role("cell", name="alice").wait_for()
    shot(live, "live-queued")
    Control.objects.filter(id=1).update(paused=False)
    live.locator('svg[aria-label^="Files restored per hour: 3 in all"]').wait_for()
    live.get_by_text("Nobody has files queued.").wait_for()
    shot(live, "live-restored")
    assert "/live/" in live.url

    page.reload()
    states = dict(page.locator("tr[data-state]").evaluate_all(
        "rows => rows.map(r => [r.querySelector('.path span').title, r.dataset.state])"))
    assert states == {"/star/raw/f1.daq": "done", "/star/raw/f2.daq": "done", "/star/raw/f3.daq": "done",
                      "/star/raw/unwanted.daq": "cancelled"}
    shot(page, "my-requests-done")
    assert RestoreRequest.objects.filter(user=alice, state="done").count() == 3


def test_an_operator_changes_the_sharing_policy_and_the_live_page_follows(open_page, operator, alice):
    operator.is_superuser = True
    operator.save()
    Control.objects.update_or_create(id=1, defaults={"share_policy": "GRPW"})
    live = open_page()
    log_in(live, "operator")
    nav(live, "Live staging")
    policy = live.get_by_test_id("share-policy")
    assert policy.inner_text() == "GRPW"

    admin = open_page()
    log_in(admin, "operator")
    admin.goto("/live/")
    admin.get_by_role("link", name="Policies, pause and resume, limits").click()
    admin.get_by_label("Share policy").select_option("EQUAL")
    shot(admin, "admin-control")
    admin.get_by_role("button", name="Save", exact=True).click()
    admin.get_by_text("was changed successfully").wait_for()

    # No reload: the fragment, polled every few seconds, brings the new policy.
    live.get_by_test_id("share-policy").filter(has_text="EQUAL").wait_for()
    shot(live, "live-operator")


def test_an_operator_sees_the_same_share_on_the_live_page_and_the_usage_report(open_page, today, operator):
    """One share (carousel/outlook/shares.py): the live page and the usage report, for today so
    far, give each user the same share of drive time, with the same period named beside it."""
    day = f"{usage.day_floor(today):%Y-%m-%d}"
    period = f"today ({day} UTC, so far)"
    page = open_page()
    log_in(page, "operator")
    nav(page, "Live staging")
    users = page.get_by_role("table").filter(has=page.get_by_role("columnheader", name="User", exact=True))
    users.get_by_role("columnheader", name=f"Share of drive time, {period}").wait_for()
    on_live = {name: users.get_by_role("row").filter(has_text=name).get_by_test_id("user-share").inner_text()
               for name in ("alice", "charlie")}
    shot(page, "live-shares")

    nav(page, "Usage")
    page.get_by_label("From (UTC day)").fill(day)
    page.get_by_label("To (UTC day, included)").fill(day)
    page.get_by_role("button", name="Show").click()
    page.get_by_role("columnheader", name=f"Share of drive time, {period}").wait_for()
    in_report = {name: page.get_by_role("row").filter(has=page.get_by_role("rowheader", name=name, exact=True))
                 .get_by_test_id("usage-share").inner_text() for name in ("alice", "charlie")}
    shot(page, "usage-shares")
    # alice: 3/4 of the one finished mount; charlie: the rest of it and the mount on a drive now.
    assert on_live == in_report == {"alice": "45%", "charlie": "55%"}


def test_the_pages_read_well_on_a_phone(open_page, alice, now):
    from carousel.domain.services import restore_submit

    restore_submit(user=alice, now=now, paths=[f"/star/raw/run{i:03d}/a-rather-long-file-name-{i}.daq"
                                               for i in range(5)])
    page = open_page(width=375, height=740)
    log_in(page, "alice")
    for url, name in (("/", "phone-my-requests"), ("/restore/", "phone-restore"), ("/live/", "phone-live")):
        page.goto(url)
        assert fits(page, 375), f"{url} is wider than a phone"
        shot(page, name)
    page.goto("/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the content"
