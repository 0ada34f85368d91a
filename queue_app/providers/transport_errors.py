"""Whether a failed request reached the server: the one question a retry depends on.

A request that was never written — the connection refused, the name not resolved, the TLS
handshake failed, connecting timed out — can be sent again without doing the work twice:
`NotSent`, a transient failure. Anything else may have been received (and, for a create
call, accepted and billed). The answer is decided here from the exception requests raised,
before `scrubbed` replaces its message (which named the whole URL, a credential when it is
a signed download address) and with it the evidence.
"""

import requests
import urllib3

from queue_app.providers.crypto import scrub_urls


class NotSent(requests.ConnectionError):
    """The request was never written; `cause` says why, in words."""

    cause = "could not connect"


class _NotSentTimeout(NotSent, requests.ConnectTimeout):
    pass


class _NotSentTLS(NotSent, requests.exceptions.SSLError):
    pass


def not_sent(cls, message: str, cause: str) -> NotSent:
    error = cls(message)
    error.cause = cause
    return error


def not_sent_cause(error: requests.RequestException) -> str | None:
    """Why a request was never written, or None when it may have been."""
    if isinstance(error, requests.ConnectTimeout):
        return "connection timed out"
    if isinstance(error, requests.exceptions.SSLError):
        return "TLS handshake failed"
    reason = error.args[0] if error.args else None
    reason = getattr(reason, "reason", reason)  # MaxRetryError wraps the cause
    if isinstance(reason, urllib3.exceptions.NameResolutionError):
        return "name not resolved"
    if isinstance(reason, urllib3.exceptions.NewConnectionError):
        return "connection refused" if "refused" in str(reason).lower() else "no connection"
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError):
        return "connection timed out"
    return None


def scrubbed(error: requests.RequestException) -> requests.RequestException:
    """The same error with its message cut to scheme://host[:port]; one that was never
    sent comes back as `NotSent`, of the same requests class (a refused connection stays a
    ConnectionError, a connect timeout a ConnectTimeout), so every `except` still matches."""
    cause = not_sent_cause(error)
    message = scrub_urls(str(error))
    if cause is None:
        error.args = (message,)
        return error
    if isinstance(error, requests.ConnectTimeout):
        return not_sent(_NotSentTimeout, message, cause)
    if isinstance(error, requests.exceptions.SSLError):
        return not_sent(_NotSentTLS, message, cause)
    return not_sent(NotSent, message, cause)
