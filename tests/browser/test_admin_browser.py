"""The journal admin in a real browser: headless Chromium against a live server.

The test fills the SQLite ``default`` journal through the claim store, serves the
admin with pytest-django's ``live_server`` (a real HTTP server, in a thread of the
test process), and drives the admin as an operator would: log in, filter, search,
read a memo, release a stale claim through its confirmation page; then checks that a
view-only user is not offered the action. Screenshots land in ``tests/artifacts/screenshots/``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models import F

from celery_grousset.claim import ClaimRequest
from celery_grousset.models import Outcome
from celery_grousset.store import get_store
from celery_grousset.store.base import Completion
from tests import services

if TYPE_CHECKING:
    from pytest_django.fixtures import Settings
    from pytest_django.live_server_helper import LiveServer

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
SHOTS = ARTIFACTS / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def server(live_server: LiveServer, settings: Settings) -> str:
    """pytest-django's ``live_server`` on the test settings and the ``default`` journal."""
    services.require_database("default")
    settings.GROUSSET = {**settings.GROUSSET, "DATABASE": "default"}
    return str(live_server.url)


def put(processor: str, task: str, status: str, memo: bytes = b"") -> Outcome:
    fp, token = uuid.uuid4().hex + uuid.uuid4().hex, uuid.uuid4().hex
    store = get_store("default")
    store.claim(ClaimRequest(
        processor_id=processor, fingerprint=fp, task_name=task, task_id=f"task-{uuid.uuid4()}",
        token=token, worker="worker-1@host", args_repr="(42, amount='[redacted]')",
        max_processing_time=60.0, expires_after=7 * 86400.0, max_takeovers=3,
    ))  # fmt: skip
    if status != "in_flight":
        store.finish(processor, fp, token, Completion(status, memo, "application/json;utf-8"))
    else:  # stuck: its holder died; the claim is past its own deadline
        Outcome.objects.using("default").filter(processor_id=processor, fingerprint=fp).update(
            stale_at=F("started_at")
        )
    return Outcome.objects.using("default").get(processor_id=processor, fingerprint=fp)


def shot(page: object, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"admin-{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    print(f"screenshot: {path}")
    return path


def assert_fits(page: object, column: str) -> None:
    """Every cell of ``column`` (its header too) is fully visible: inside the viewport and
    inside the results box (which would otherwise scroll it sideways, cut at its edge)."""
    width = page.viewport_size["width"]  # type: ignore[attr-defined]
    results = page.locator("#changelist .results").bounding_box()  # type: ignore[attr-defined]
    right = min(width, results["x"] + results["width"])
    cells = page.locator(f"#result_list [class*='column-{column}'], "  # type: ignore[attr-defined]
                         f"#result_list [class*='field-{column}']")  # fmt: skip
    assert cells.count() >= 4
    for cell in cells.all():
        box = cell.bounding_box()
        assert box is not None and box["width"] > 0, column
        assert box["x"] >= 0 and box["x"] + box["width"] <= right + 0.5, (column, box, right)
    # and nothing scrolls sideways: the whole table fits
    overflow = page.evaluate(  # type: ignore[attr-defined]
        "[document.querySelector('#changelist .results').scrollWidth"
        " - document.querySelector('#changelist .results').clientWidth,"
        " document.documentElement.scrollWidth - window.innerWidth]"
    )
    assert overflow[0] <= 0 and overflow[1] <= 0, overflow


def test_operator_filters_searches_reads_and_releases(server: str, processor: str) -> None:
    if not os.path.exists(CHROMIUM):
        services.unavailable("Chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        services.unavailable("playwright", str(exc))
    # Given a journal with a receipt memo, a failure and a stuck claim, and two users
    receipt = put(processor, "shop.send_receipt", "completed",
                  b'{"provider_id": "msg_8f2c", "to": "ana@example.com", "ok": true}')  # fmt: skip
    put(processor, "shop.charge_card", "failed")
    stuck = put(processor, "shop.book_room", "in_flight")
    admin_name, viewer_name = f"op-{uuid.uuid4().hex[:8]}", f"view-{uuid.uuid4().hex[:8]}"
    users = User.objects.db_manager("default")
    users.create_superuser(admin_name, "op@example.com", "op-pass-1")
    viewer = users.create_user(viewer_name, "v@example.com", "view-pass-1", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_outcome"))
    changelist = f"{server}/admin/celery_grousset/outcome/?processor={processor}"

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
            page = context.new_page()
            # When the operator logs in and opens the journal
            page.goto(f"{server}/admin/login/?next=/admin/")
            page.fill("#id_username", admin_name)
            page.fill("#id_password", "op-pass-1")
            page.click("input[type=submit]")
            page.wait_for_load_state()
            page.goto(changelist)
            # Then the three rows are listed with their badges
            assert page.locator("#result_list tbody tr").count() == 3
            assert page.locator(".grousset-status-in_flight").count() == 1
            # And at 1400 px the row fits the window: the started column is not cut
            for column in ("started", "completed", "age", "status"):
                assert_fits(page, column)
            # And the copy control is a glyph (an icon with a label), not the word "copy"
            copy = page.locator(f".grousset-copy[data-copy='{receipt.fingerprint}']")
            assert copy.inner_text().strip() == "" and copy.locator("svg").count() == 1
            assert copy.get_attribute("aria-label") == "Copy the full fingerprint"
            icon = copy.locator("svg").bounding_box()
            assert icon is not None and icon["width"] >= 10 and icon["height"] >= 10
            # And the copy button puts the full fingerprint on the clipboard
            page.click(f".grousset-copy[data-copy='{receipt.fingerprint}']")
            page.wait_for_selector(".grousset-copy[data-copied=yes]", timeout=5000)
            assert page.evaluate("navigator.clipboard.readText()") == receipt.fingerprint
            shot(page, "changelist")
            # When they filter by status / Then only the stuck claim is left
            page.click("#changelist-filter a[href*='status=in_flight']")
            page.wait_for_url("**status=in_flight**")
            page.wait_for_load_state()
            assert page.locator("#result_list tbody tr").count() == 1
            assert stuck.fingerprint[:12] in page.inner_text("#result_list")
            # When they search a fingerprint prefix / Then the receipt is found
            page.goto(changelist)
            page.fill("#searchbar", receipt.fingerprint[:10])
            page.press("#searchbar", "Enter")
            page.wait_for_load_state()
            assert page.locator("#result_list tbody tr").count() == 1
            shot(page, "search")
            # When they open it / Then the memo is shown, pretty-printed
            page.click(f"#result_list a[href*='/{receipt.pk}/change/']")
            page.wait_for_load_state()
            memo = page.inner_text("pre.grousset-memo")
            assert '"provider_id": "msg_8f2c"' in memo and memo.count("\n") >= 4
            shot(page, "detail")
            # When they release the stuck claim through the confirmation page
            page.goto(changelist)
            page.check(f"input.action-select[value='{stuck.pk}']")
            page.select_option("select[name=action]", "release_stale_claims")
            page.click("button[name=index]")
            page.wait_for_load_state()
            assert "Release stale claims" in page.inner_text("#content h1")
            assert page.locator("tr.grousset-will-change").count() == 1
            shot(page, "confirm-release")
            page.click("input[name=confirm]")
            page.wait_for_load_state()
            # Then the claim is released and the operator is told
            assert "Released 1 claim(s)" in page.inner_text(".messagelist")
            shot(page, "released")

            # When a view-only user opens the journal
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.goto(f"{server}/admin/login/?next=/admin/")
            page.fill("#id_username", viewer_name)
            page.fill("#id_password", "view-pass-1")
            page.click("input[type=submit]")
            page.wait_for_load_state()
            page.goto(changelist)
            # Then they see the rows but are offered no action
            assert page.locator("#result_list tbody tr").count() == 3
            offered = page.locator("select[name=action] option[value=release_stale_claims]")
            assert offered.count() == 0
            assert page.locator("input.action-select").count() == 0
            shot(page, "view-only")
        finally:
            browser.close()
    # And the journal says so (the ORM is sync-only: checked once the browser is closed)
    assert Outcome.objects.using("default").get(pk=stuck.pk).status == "failed"
