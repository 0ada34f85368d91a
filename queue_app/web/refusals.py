"""A refusal as a program reads it: `{code, message, retriable, status, field?}`, the
same for the MCP tools (structuredContent of an isError result) and the JSON API (beside
its "error" text). `code` is a stable word an agent can branch on; `retriable` says
whether the same call may succeed later unchanged (a key still in progress, a provider
still busy), never after a fix of the arguments."""

from queue_app.services.errors import ServiceError

BY_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
    429: "rate_limited",
    503: "unavailable",
}
RETRIABLE_STATUSES = (429, 503)

# The codes an agent may meet; the reasons services give are more precise than a status.
CODES = (*BY_STATUS.values(), "key_reused", "in_progress", "busy", "not_a_draft", "storage_full", "refused")


def describe(refusal: ServiceError) -> dict:
    retriable = getattr(refusal, "retriable", None)
    described = {
        "code": getattr(refusal, "reason", "") or BY_STATUS.get(refusal.code, "refused"),
        "message": refusal.message,
        "retriable": refusal.code in RETRIABLE_STATUSES if retriable is None else retriable,
        "status": refusal.code,
    }
    field = getattr(refusal, "field", None)
    return {**described, "field": field} if field else described
