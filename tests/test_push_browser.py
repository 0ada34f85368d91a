"""The preferences page in Chromium: it registers the service worker, subscribes this
browser, and a push reaches the service worker as a notification.

Chromium cannot reach a real push service here (no network), so the page's
PushManager.subscribe answers with a fake device's subscription on our loopback push
service; everything else is the browser's own: permission, service worker, page script.
"""

import json
import time

import pytest
from django.db import connections

from queue_app.models import PushSubscription
from queue_app.notifications import devices, vapid
from tests import procs
from tests.fakes.push_service import Device, PushService

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


FAKE_PUSH_MANAGER = """
(() => {
  const info = %s;
  let current = null;
  PushManager.prototype.subscribe = function (options) {
    window.__subscribeKey = Array.from(new Uint8Array(options.applicationServerKey));
    current = {
      endpoint: info.endpoint, expirationTime: null,
      options: { applicationServerKey: options.applicationServerKey, userVisibleOnly: options.userVisibleOnly },
      toJSON() { return { endpoint: info.endpoint, expirationTime: null, keys: info.keys }; },
      unsubscribe() { current = null; return Promise.resolve(true); },
    };
    return Promise.resolve(current);
  };
  PushManager.prototype.getSubscription = function () { return Promise.resolve(current); };
})();
"""


@pytest.fixture
def web(settings, tmp_path):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]  # the web process may call the loopback push service
    proc = procs.daphne(tmp_path / "logs", REDIS_URL="")
    try:
        yield proc
    finally:
        proc.stop()


def test_the_preferences_page_subscribes_this_browser_with_a_registered_service_worker(chromium, web, owner):
    base = web.url
    with PushService() as push_service:
        device = Device(push_service.endpoint("chromium"))
        context = chromium.new_context()
        context.grant_permissions(["notifications"], origin=base)
        context.add_init_script(FAKE_PUSH_MANAGER % json.dumps(device.subscription_info()))
        page = context.new_page()
        page.goto(f"{base}/accounts/login/?next=/account/preferences/")
        page.fill("input[name=username]", owner.username)
        page.fill("input[name=password]", "pw-" + owner.username)
        page.click("main button[type=submit]")
        page.wait_for_url(f"{base}/account/preferences/")
        page.wait_for_selector('#push-state[data-state="off"]', timeout=20_000)
        page.click("#push-on")
        page.wait_for_selector('#push-state[data-state="on"]', timeout=20_000)

        registration = page.evaluate(
            """async () => {
                const reg = await navigator.serviceWorker.getRegistration("/");
                return reg && { scope: reg.scope, script: reg.active && reg.active.scriptURL };
            }"""
        )
        assert registration == {"scope": f"{base}/", "script": f"{base}/sw.js"}
        subscription = PushSubscription.objects.get()
        assert subscription.user == owner and subscription.endpoint == device.endpoint
        assert "Chrome" in subscription.user_agent
        public, _ = vapid.vapid_keys()
        assert bytes(page.evaluate("window.__subscribeKey")) == devices._b64decode(public)

        # The test button sends through the push service to this browser's subscription.
        page.click("#push-test")
        page.wait_for_function("document.getElementById('push-message').textContent.includes('sent')", timeout=20_000)
        [message] = device.messages(push_service)
        assert message["title"] == "Remix Studio Queue"

        # A push delivered to the service worker becomes a notification with the project's tag.
        cdp = context.new_cdp_session(page)
        registrations = []
        cdp.on("ServiceWorker.workerRegistrationUpdated", lambda event: registrations.extend(event["registrations"]))
        cdp.send("ServiceWorker.enable")
        deadline = time.monotonic() + 20
        while not any(not r.get("isDeleted") for r in registrations) and time.monotonic() < deadline:
            page.wait_for_timeout(50)  # lets Playwright deliver the CDP events
        [registration_id] = {r["registrationId"] for r in registrations if not r.get("isDeleted")}
        payload = {"title": "Foxes is done", "body": "All 3 jobs finished.", "url": "/projects/7/", "tag": "project-7"}
        # wait_for_function would take an async predicate's Promise itself as truthy and
        # return at once: ask again until the service worker has shown the notification.
        # A push delivered while the worker is still starting can be dropped by Chromium
        # (seen once in CI): deliver it again every few seconds; the tag keeps it one.
        shown, deadline, delivered_at = [], time.monotonic() + 30, 0.0
        while not shown and time.monotonic() < deadline:
            if time.monotonic() - delivered_at > 5:
                cdp.send(
                    "ServiceWorker.deliverPushMessage",
                    {"origin": base, "registrationId": registration_id, "data": json.dumps(payload)},
                )
                delivered_at = time.monotonic()
            shown = page.evaluate(
                """async () => {
                    const reg = await navigator.serviceWorker.ready;
                    const list = await reg.getNotifications();
                    return list.map((n) => ({ title: n.title, body: n.body, tag: n.tag, url: n.data.url }));
                }"""
            )
            if not shown:
                page.wait_for_timeout(100)
        assert shown == [{**{k: payload[k] for k in ("title", "body", "tag")}, "url": f"{base}/projects/7/"}]

        # Turning it off removes this browser's row.
        page.click("#push-off")
        page.wait_for_selector('#push-state[data-state="off"]', timeout=20_000)
        assert PushSubscription.objects.count() == 0
        context.close()
    # Code under Playwright's sync API runs in its own context, with its own database
    # connection; close it, or PostgreSQL cannot drop the test database.
    connections.close_all()


NOTIFICATIONS = """async (tag) => {
    const reg = await navigator.serviceWorker.ready;
    return (await reg.getNotifications(tag ? { tag } : {})).map((n) => ({ tag: n.tag, body: n.body, run: n.data.run }));
}"""


def test_a_runs_notification_is_shown_once_even_when_its_push_arrives_twice(chromium, web, owner):
    base = web.url
    context = chromium.new_context()
    context.grant_permissions(["notifications"], origin=base)
    page = context.new_page()
    page.goto(f"{base}/accounts/login/?next=/account/preferences/")
    page.fill("input[name=username]", owner.username)
    page.fill("input[name=password]", "pw-" + owner.username)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{base}/account/preferences/")
    page.wait_for_selector('#push-state[data-state="off"]', timeout=20_000)
    cdp = context.new_cdp_session(page)
    registrations = []
    cdp.on("ServiceWorker.workerRegistrationUpdated", lambda event: registrations.extend(event["registrations"]))
    cdp.send("ServiceWorker.enable")
    deadline = time.monotonic() + 20
    while not any(not r.get("isDeleted") for r in registrations) and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    [registration_id] = {r["registrationId"] for r in registrations if not r.get("isDeleted")}

    def deliver_until_shown(payload):
        # Redelivers every few seconds (a push to a starting worker can be dropped); the
        # same run is shown once, so redelivery cannot make a second notification.
        shown, deadline, delivered_at = [], time.monotonic() + 30, 0.0
        while not shown and time.monotonic() < deadline:
            if time.monotonic() - delivered_at > 5:
                data = json.dumps(payload)
                cdp.send("ServiceWorker.deliverPushMessage", {"origin": base, "registrationId": registration_id, "data": data})
                delivered_at = time.monotonic()
            shown = page.evaluate(NOTIFICATIONS, payload["tag"])
            if not shown:
                page.wait_for_timeout(100)
        return shown

    first = {"title": "Foxes is done", "body": "run 1", "tag": "project-7", "run": 1}
    assert deliver_until_shown(first) == [{"tag": "project-7", "body": "run 1", "run": 1}]
    # The user dismisses it; the sender (killed mid-send) then sends the same run again.
    page.evaluate("async () => (await (await navigator.serviceWorker.ready).getNotifications()).forEach((n) => n.close())")
    cdp.send("ServiceWorker.deliverPushMessage", {"origin": base, "registrationId": registration_id, "data": json.dumps(first)})
    # A later push on another tag shows the worker has handled the duplicate by then.
    assert deliver_until_shown({"title": "Probe", "body": "probe", "tag": "probe"})
    page.wait_for_timeout(500)
    assert page.evaluate(NOTIFICATIONS, "project-7") == []
    # The next run of the same project is a new notification.
    second = {**first, "body": "run 2", "run": 2}
    assert deliver_until_shown(second) == [{"tag": "project-7", "body": "run 2", "run": 2}]
    context.close()
    connections.close_all()
