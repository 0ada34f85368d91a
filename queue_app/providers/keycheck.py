""" "Test key": one cheap authenticated call per family, through the guarded client, and
what it found — ok, bad key, or unreachable. The answer never names the address a host
resolved to (net.py's refusals do not either) and never echoes the key.

- OpenAI: GET {base}/models            - Gemini: GET {base}/models?pageSize=1
- Replicate: GET {base}/account        - RunningHub: GET {base}/queue/status (v2)
- Civitai: GET {base}/v2/consumer/workflows/<a random id> — a 404 means the token was
  accepted (there is no cheaper authenticated read in its API).
"""

import logging
import uuid

import requests

from queue_app.providers import civitai, google, net, openai, replicate, runninghub
from queue_app.providers.crypto import redact

log = logging.getLogger(__name__)

TIMEOUT = (5, 10)


def _probe(provider) -> tuple[str, dict]:
    """(url, headers) of the family's cheap authenticated call."""
    key = provider.api_key
    bearer = {"Authorization": f"Bearer {key}"}
    base = (provider.base_url or "").rstrip("/")
    family = provider.family
    if family == "openai":
        return f"{base or openai.DEFAULT_BASE}/models", bearer
    if family == "google":
        return f"{base or google.DEFAULT_BASE}/models?pageSize=1", {"x-goog-api-key": key}
    if family == "replicate":
        return f"{base or replicate.DEFAULT_BASE}/account", bearer
    if family == "runninghub":
        return f"{base or runninghub.DEFAULT_BASE}/queue/status", bearer
    if family == "civitai":
        return f"{base or civitai.DEFAULT_BASE}/v2/consumer/workflows/{uuid.uuid4()}", bearer
    raise ValueError(family)


def _bad_key(provider, response) -> bool:
    if response.status_code in (401, 403):
        return True
    if provider.family == "google" and response.status_code == 400:
        return b"API_KEY_INVALID" in response.content or b"API key not valid" in response.content
    if provider.family == "runninghub":
        try:
            body = response.json()
        except ValueError:
            return False
        code = str(body.get("errorCode") or body.get("code") or "") if isinstance(body, dict) else ""
        return code in ("412", "401", "403")  # 412: TOKEN_INVALID / key not found
    return False


def test_key(provider) -> dict:
    """{"result": "ok" | "bad_key" | "unreachable" | "error", "message": str}."""
    if provider.family == "demo":
        return {"result": "ok", "message": "ok: the demo provider needs no key (it answers offline)"}
    if not provider.api_key_encrypted:
        return {"result": "bad_key", "message": "no key is stored: enter one and save"}
    try:
        url, headers = _probe(provider)
    except ValueError:
        return {"result": "error", "message": f"no key test for the {provider.family} family"}
    try:
        response = net.request("GET", url, headers=headers, timeout=TIMEOUT, max_bytes=1_000_000)
    except net.UnsafeURL as refusal:
        return {"result": "unreachable", "message": f"unreachable: {refusal}"}
    except (requests.RequestException, net.TooLarge, OSError) as failure:
        log.info("key test of provider %s: %s", provider.id, type(failure).__name__)
        return {"result": "unreachable", "message": f"unreachable: {type(failure).__name__.replace('Error', ' error').strip()}"}
    status = response.status_code
    if _bad_key(provider, response):
        return {"result": "bad_key", "message": f"bad key: the provider refused it (HTTP {status})"}
    if 200 <= status < 300 or (provider.family == "civitai" and status == 404):
        return {"result": "ok", "message": f"ok: the key works (HTTP {status})"}
    detail = redact(response.text[:2000], [provider.api_key])[:200]
    return {"result": "error", "message": f"the provider answered HTTP {status}: {detail}"}
