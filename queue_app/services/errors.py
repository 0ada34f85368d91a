"""The error every write service raises with a sentence for the user, and the checks
that several services (and the API's bodies) share."""

from django.core.exceptions import ValidationError


class ServiceError(Exception):
    """A refusal with a message meant for the user; `code` maps to an HTTP status. For
    programs (web/refusals.py): `field` names the argument it is about, `reason` is a
    stable word more precise than the status, `retriable` whether the same call may
    succeed later unchanged (None: what the status says)."""

    def __init__(
        self, message: str, code: int = 400, *, field: str | None = None, reason: str = "", retriable: bool | None = None
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        self.reason = reason
        self.retriable = retriable


def within_limits(check, value) -> None:
    """Run one of queue_app.limits' checks; its refusal becomes a ServiceError."""
    try:
        check(value)
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages)) from None


def refuse_unknown(data: dict, known) -> None:
    """A body with a field we do not know is refused whole, naming the fields: a typo must
    not be saved as nothing."""
    unknown = set(data) - set(known)
    if unknown:
        raise ServiceError(f"unknown field(s): {', '.join(sorted(unknown))}")
