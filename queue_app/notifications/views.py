"""Account → Preferences: notifications per browser, and the service worker.

Thin views: parse, call a service in queue_app.notifications, answer. "Notifications on"
is per device: a PushSubscription row for that browser is the user's notification
preference, and nothing else decides who gets a notification (no account-wide flag that
could disagree with the rows).
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST

from queue_app.models import PushSubscription
from queue_app.notifications import devices, outbox, vapid


def _json_body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: a refusal, not a 500
        return {}
    return body if isinstance(body, dict) else {}


@login_required
def preferences(request):
    public_key, _ = vapid.vapid_keys()
    rows = [
        {
            "id": sub.id,
            "service": outbox.endpoint_host(sub.endpoint),
            "user_agent": sub.user_agent,
            "created_at": sub.created_at,
            "last_used_at": sub.last_used_at,
        }
        for sub in PushSubscription.objects.filter(user=request.user)
    ]
    return render(request, "account/preferences.html", {"vapid_public_key": public_key, "devices": rows})


@login_required
@require_POST
def push_subscribe(request):
    body = _json_body(request)
    keys = body.get("keys") if isinstance(body.get("keys"), dict) else {}
    try:
        subscription = devices.subscription_save(
            user=request.user,
            endpoint=body.get("endpoint") or "",
            p256dh=str(keys.get("p256dh") or ""),
            auth=str(keys.get("auth") or ""),
            user_agent=request.headers.get("user-agent", ""),
        )
    except devices.BadSubscription as error:
        return JsonResponse({"ok": False, "error": str(error)}, status=400)
    return JsonResponse({"ok": True, "id": subscription.id})


@login_required
@require_POST
def push_unsubscribe(request):
    """JSON {endpoint} from the page's switch, or a form's `id` from the device list."""
    if request.content_type == "application/json":
        deleted = devices.subscription_delete(user=request.user, endpoint=str(_json_body(request).get("endpoint") or ""))
        return JsonResponse({"ok": True, "deleted": deleted})
    try:
        subscription_id = int(request.POST.get("id", ""))
    except ValueError:
        subscription_id = -1
    if devices.subscription_delete(user=request.user, subscription_id=subscription_id):
        messages.success(request, "Notifications are off for that device.")
    return redirect("account_preferences")


@login_required
@require_POST
def push_status(request):
    endpoint = str(_json_body(request).get("endpoint") or "")
    subscribed = bool(endpoint) and PushSubscription.objects.filter(user=request.user, endpoint=endpoint).exists()
    return JsonResponse({"subscribed": subscribed})


@login_required
@require_POST
def push_test(request):
    endpoint = str(_json_body(request).get("endpoint") or "")
    subscription = PushSubscription.objects.filter(user=request.user, endpoint=endpoint).first() if endpoint else None
    if subscription is None:
        return JsonResponse({"ok": False, "error": "this browser is not subscribed"}, status=404)
    outcome = devices.test_send(subscription=subscription)
    sent = outcome == outbox.Delivery.SENT
    return JsonResponse({"ok": sent, "outcome": outcome}, status=200 if sent else 502)


@require_GET
def service_worker(request):
    response = HttpResponse(render_to_string("account/sw.js"), content_type="application/javascript; charset=utf-8")
    # Served from the root so it may control every page; browsers re-check it on each visit.
    response["Service-Worker-Allowed"] = "/"
    response["Cache-Control"] = "no-cache"
    return response
