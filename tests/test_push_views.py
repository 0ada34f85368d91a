"""Account → Preferences and the push endpoints: per-browser subscriptions, the test
notification, the service worker."""

import json

import pytest

from queue_app.models import PushSubscription
from queue_app.notifications import devices, vapid
from tests.fakes.push_service import Device, PushService

pytestmark = pytest.mark.django_db


@pytest.fixture
def push_service(settings):
    settings.OUTBOUND_ALLOWLIST = ["http://127.0.0.1"]
    with PushService() as service:
        yield service


def post_json(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_the_preferences_page_needs_a_login_and_offers_the_switch(client, owner):
    assert client.get("/account/preferences/").status_code == 302
    client.force_login(owner)
    page = client.get("/account/preferences/").content.decode()
    public, _ = vapid.vapid_keys()
    assert 'id="push-on"' in page and 'id="push-test"' in page and public in page
    assert "installed web app" in page and "secure connection" in page


def test_subscribe_stores_this_browser_and_status_reports_it(client, owner, push_service):
    client.force_login(owner)
    device = Device(push_service.endpoint("phone"))
    answer = client.post(
        "/push/subscribe",
        data=json.dumps(device.subscription_info()),
        content_type="application/json",
        HTTP_USER_AGENT="Firefox/140",
    )
    assert answer.status_code == 200 and answer.json()["ok"]
    subscription = PushSubscription.objects.get()
    assert (subscription.user, subscription.endpoint, subscription.user_agent) == (owner, device.endpoint, "Firefox/140")
    assert post_json(client, "/push/status", {"endpoint": device.endpoint}).json() == {"subscribed": True}
    assert post_json(client, "/push/status", {"endpoint": device.endpoint + "x"}).json() == {"subscribed": False}
    page = client.get("/account/preferences/").content.decode()
    assert "Firefox/140" in page and device.endpoint.rsplit("/", 1)[1] not in page, "the endpoint's token is not rendered"
    # subscribing again is an update, not a second row
    assert post_json(client, "/push/subscribe", device.subscription_info()).status_code == 200
    assert PushSubscription.objects.count() == 1


def test_a_browser_re_subscribed_under_another_account_moves_to_it(client, owner, outsider, push_service):
    info = Device(push_service.endpoint("shared")).subscription_info()
    client.force_login(owner)
    post_json(client, "/push/subscribe", info)
    client.force_login(outsider)
    post_json(client, "/push/subscribe", info)
    assert list(PushSubscription.objects.values_list("user__username", flat=True)) == ["outsider"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda info: info.update(endpoint="http://10.1.2.3/push/x"),
        lambda info: info["keys"].update(p256dh="AAAA"),
        lambda info: info["keys"].update(auth="%%%"),
        lambda info: info.pop("keys"),
        lambda info: info.update(endpoint="https://example.com/" + "x" * 2100),
    ],
)
def test_subscribe_refuses_bad_subscriptions(client, owner, push_service, mutate):
    client.force_login(owner)
    info = Device(push_service.endpoint("phone")).subscription_info()
    mutate(info)
    answer = post_json(client, "/push/subscribe", info)
    assert answer.status_code == 400 and answer.json()["ok"] is False
    assert PushSubscription.objects.count() == 0


def test_unsubscribe_removes_only_the_users_own_browser(client, owner, outsider, push_service):
    mine = devices.subscription_save(user=owner, **_flat(Device(push_service.endpoint("mine"))))
    theirs = devices.subscription_save(user=outsider, **_flat(Device(push_service.endpoint("theirs"))))
    client.force_login(owner)
    assert post_json(client, "/push/unsubscribe", {"endpoint": theirs.endpoint}).json()["deleted"] == 0
    client.post("/push/unsubscribe", {"id": theirs.id})
    assert PushSubscription.objects.filter(id=theirs.id).exists()
    assert post_json(client, "/push/unsubscribe", {"endpoint": mine.endpoint}).json()["deleted"] == 1
    assert list(PushSubscription.objects.values_list("id", flat=True)) == [theirs.id]


def test_the_device_list_removes_a_device(client, owner, push_service):
    mine = devices.subscription_save(user=owner, **_flat(Device(push_service.endpoint("old"))))
    client.force_login(owner)
    answer = client.post("/push/unsubscribe", {"id": mine.id})
    assert answer.status_code == 302 and answer["location"] == "/account/preferences/"
    assert PushSubscription.objects.count() == 0


def test_the_test_notification_reaches_this_browser_only(client, owner, push_service):
    phone, laptop = Device(push_service.endpoint("phone")), Device(push_service.endpoint("laptop"))
    for device in (phone, laptop):
        devices.subscription_save(user=owner, **_flat(device))
    client.force_login(owner)
    answer = post_json(client, "/push/test", {"endpoint": phone.endpoint})
    assert answer.json() == {"ok": True, "outcome": "sent"}
    [message] = phone.messages(push_service)
    assert message["title"] == "Remix Studio Queue" and "Notifications are working" in message["body"]
    assert laptop.messages(push_service) == []
    assert PushSubscription.objects.get(endpoint=phone.endpoint).last_used_at is not None


def test_a_test_notification_to_a_gone_browser_forgets_it(client, owner, push_service):
    phone = Device(push_service.endpoint("phone"))
    devices.subscription_save(user=owner, **_flat(phone))
    push_service.respond(phone.endpoint, 410)
    client.force_login(owner)
    answer = post_json(client, "/push/test", {"endpoint": phone.endpoint})
    assert answer.status_code == 502 and answer.json()["outcome"] == "gone"
    assert PushSubscription.objects.count() == 0


def test_the_test_notification_refuses_another_users_browser(client, owner, outsider, push_service):
    theirs = Device(push_service.endpoint("theirs"))
    devices.subscription_save(user=outsider, **_flat(theirs))
    client.force_login(owner)
    assert post_json(client, "/push/test", {"endpoint": theirs.endpoint}).status_code == 404
    assert push_service.received() == []


def test_the_service_worker_is_served_from_the_root_for_the_whole_site(client):
    answer = client.get("/sw.js")
    assert answer.status_code == 200
    assert answer["content-type"].startswith("application/javascript")
    assert answer["service-worker-allowed"] == "/" and answer["cache-control"] == "no-cache"
    body = answer.content.decode()
    assert 'addEventListener("push"' in body and 'addEventListener("notificationclick"' in body
    assert "self.location.origin" in body  # clicks open same-origin pages only


def _flat(device: Device) -> dict:
    info = device.subscription_info()
    return {"endpoint": info["endpoint"], **info["keys"]}
