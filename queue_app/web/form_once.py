"""Every page form that creates or starts something carries a one-time token
(`{% form_token %}`), and this middleware holds it to one result: the first POST with a
token runs its view; a repeat (double click, reload after the POST, back button and send
again) is answered with the first one's answer — its redirect, or its JSON for the pages'
fetch() calls — and nothing is done twice. The pages' script also disables a button once
its form is sent (static/queue_app/forms.js); this is what holds without it.
"""

import asyncio
import hashlib
import json
import uuid

from django.contrib import messages
from django.http import HttpResponseRedirect, JsonResponse
from django.utils.http import url_has_allowed_host_and_scheme

from queue_app.services import form_once

FIELD = "form_token"
HEADER = "X-Form-Token"
SKIPPED_FIELDS = ("csrfmiddlewaretoken", FIELD)
REPEATED = "That form was already sent: it was done once."


def new_token() -> str:
    return uuid.uuid4().hex


def fingerprint(request) -> str:
    """What was sent, but for the per-page tokens: the same form sent twice matches."""
    fields = sorted((k, v) for k in request.POST for v in request.POST.getlist(k) if k not in SKIPPED_FIELDS)
    files = sorted((k, f.name, f.size) for k in request.FILES for f in request.FILES.getlist(k))
    body = json.dumps([request.path, fields, files], default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def answer_of(response) -> dict | None:
    """What a repeat gets back: a redirect's address or a fetch call's JSON; None for any
    other answer (a form shown again with its errors: sending it again is a new try)."""
    if isinstance(response, HttpResponseRedirect):
        return {"redirect": response["Location"]}
    if isinstance(response, JsonResponse) and response.status_code == 200:
        return {"json": json.loads(response.content)}
    return None


def replay(request, answer: dict):
    if "json" in answer:
        return JsonResponse(answer["json"])
    messages.info(request, REPEATED)
    return HttpResponseRedirect(answer["redirect"])


def still_running(request):
    """The first request is still at work after the wait: say so, and do nothing twice."""
    text = "That form is still being sent: wait a moment and reload the page."
    if request.headers.get("X-Requested-With") == "fetch":
        return JsonResponse({"messages": [{"level": "info", "text": text}]})
    messages.info(request, text)
    back = request.headers.get("Referer", "")
    safe = url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return HttpResponseRedirect(back if safe else "/projects/")


class FormOnceMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        # a fetch() form stays on its page: it gets a fresh token for its next send
        if getattr(request, "_form_token_used", False) and isinstance(response, JsonResponse):
            response[HEADER] = new_token()
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        if request.method != "POST" or getattr(view_func, "csrf_exempt", False) or asyncio.iscoroutinefunction(view_func):
            return None
        token = request.POST.get(FIELD, "")
        if not token or len(token) > 64 or not request.user.is_authenticated:
            return None
        request._form_token_used = True
        sent = fingerprint(request)
        for _ in range(2):  # a first request that failed frees the token: then run this one
            row_id = form_once.form_claim(user=request.user, token=token, fingerprint=sent, scope=request.path)
            if row_id is not None:
                return self.run_first(request, row_id, view_func, view_args, view_kwargs)
            answer = form_once.form_answer(user=request.user, token=token, fingerprint=sent)
            if answer is not None:
                return replay(request, answer)
        return still_running(request)

    @staticmethod
    def run_first(request, row_id, view_func, view_args, view_kwargs):
        try:
            response = view_func(request, *view_args, **view_kwargs)
        except BaseException:
            form_once.form_release(row_id)
            raise
        answer = answer_of(response)
        if answer is None:
            form_once.form_release(row_id)
        else:
            form_once.form_finish(row_id, answer=answer, status=response.status_code)
        return response
