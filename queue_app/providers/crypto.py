"""Secrets at rest: Fernet with the key from FIELD_ENCRYPTION_KEY (or derived in dev)."""

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(key: str) -> Fernet:
    return Fernet(key.encode() if isinstance(key, str) else key)


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return _fernet(settings.FIELD_ENCRYPTION_KEY).encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet(settings.FIELD_ENCRYPTION_KEY).decrypt(token.encode()).decode()
    except InvalidToken:
        # A rotated key must not crash pages; the provider simply has no usable key.
        return ""


def hint(value: str) -> str:
    """What a page may show of a secret: at most its last four characters."""
    return f"…{value[-4:]}" if value and len(value) >= 8 else ("set" if value else "")


def redact(text: str, secrets) -> str:
    """`text` with every secret replaced: providers echo keys in error messages
    ("Incorrect API key provided: sk-…"), and reasons are stored, rendered and logged."""
    for secret in secrets:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[redacted]")
    return text
