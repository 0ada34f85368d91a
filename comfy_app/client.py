"""A ComfyUI HTTP client, built against the recorded shapes of ComfyUI 0.3.64.

Every call goes through `queue_app.providers.net` (timeouts, size cap, SSRF guard). Errors come
out as one of four classes the runner branches on:
- Unreachable  nothing answered (refused, DNS, connect timeout): the instance-level
               ten-minute rule applies, a job does not fail for it at once;
- CheckFailed  something answered badly (5xx, a dropped connection, not JSON, a read
               timeout): counts towards a job's three failed checks;
- AuthFailed   401/403 or a redirect to the login page;
- Rejected     400 from POST /prompt (validation): permanent, names the node and input.

Quirks handled here (README of the recordings): unknown ids answer `200 {}`; queue
items are 5-arrays; empty answers have no content type; ids are percent-encoded.
"""

import hashlib
import json
import logging
import re
import threading
from urllib.parse import quote, urlencode, urlsplit

import requests

from comfy_app import allowed_hosts
from queue_app.providers import crypto, net
from queue_app.providers.transport_errors import NotSent

log = logging.getLogger(__name__)

TIMEOUT = (5, 30)
UPLOAD_TIMEOUT = (5, 300)
UPLOAD_SUBFOLDER = "remix-studio"
BCRYPT = re.compile(r"^\$2[abxy]?\$\d{2}\$[./A-Za-z0-9]{53}$")


class ComfyError(Exception):
    permanent = False

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Unreachable(ComfyError):
    pass


class CheckFailed(ComfyError):
    pass


class AuthFailed(ComfyError):
    permanent = True


class Rejected(ComfyError):
    """POST /prompt answered 400 (validation): retrying the same prompt cannot help."""

    permanent = True

    def __init__(self, reason: str, body=None):
        super().__init__(reason)
        self.body = body


class BadAddress(ComfyError):
    permanent = True


# Form-login session cookies per (address, password hash), shared by the threads of a process.
_cookies: dict[tuple[str, str], str] = {}
_cookies_lock = threading.Lock()


def normalise_url(url: str) -> str:
    url = (url or "").strip().rstrip("/")
    if url and "://" not in url:
        url = "http://" + url
    return url


class ComfyClient:
    def __init__(self, base_url: str, *, username: str = "", password: str = ""):
        self.base_url = normalise_url(base_url)
        self.username = username
        self.password = password
        if not self.base_url:
            raise BadAddress("no ComfyUI address is set for this project")

    @property
    def address(self) -> str:
        """The address as messages may show it: scheme://host[:port], without credentials,
        path or query (a token can sit in any of them)."""
        return crypto.origin(self.base_url)

    def secret_forms(self) -> list[list[str]]:
        """Every credential of this instance as it could come back in its answers: the
        password (or bcrypt token), credentials in the address (sent as HTTP Basic), and
        the session cookie of a form login."""
        parts = urlsplit(self.base_url)
        forms = [
            crypto.secret_forms(secret, username=user)
            for user, secret in ((self.username, self.password), (parts.username or "", parts.password or ""))
            if secret
        ]
        cookie = _cookies.get(self._cookie_key()) if self.password else None
        if cookie:
            forms.append([part.split("=", 1)[-1] for part in cookie.split("; ") if len(part.split("=", 1)[-1]) >= 8])
        return forms

    def redact(self, value):
        """`value` (text, or parsed JSON) with this instance's credentials removed: what an
        instance answers ends up in job errors, the monitor and logs."""
        forms = self.secret_forms()
        if not forms:
            return value
        if isinstance(value, str):
            return crypto.redact(value, forms)
        if isinstance(value, dict):
            return {key: self.redact(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.redact(item) for item in value]
        return value

    # --- plumbing ---

    def _auth_headers(self) -> dict:
        if not self.password:
            return {}
        if BCRYPT.match(self.password):
            # ComfyUI-Login accepts its stored bcrypt hash as an API token.
            return {"Authorization": f"Bearer {self.password}"}
        cookie = _cookies.get(self._cookie_key())
        if cookie is None:
            cookie = self._login()
        return {"Cookie": cookie}

    def _cookie_key(self):
        return (self.base_url, hashlib.sha256(self.password.encode()).hexdigest())

    def _login(self) -> str:
        form = {"password": self.password}
        if self.username:
            form["username"] = self.username
        response = self._raw("POST", "/login", data=form)
        if response.status_code >= 400 or not response.cookies:
            raise AuthFailed(f"ComfyUI refused the login at {self.address}/login (HTTP {response.status_code})")
        cookie = "; ".join(f"{name}={value}" for name, value in response.cookies.items())
        # The shared outbound session keeps no cookie (net.py): the login's lives here,
        # keyed by (address, password), and is sent explicitly.
        with _cookies_lock:
            _cookies[self._cookie_key()] = cookie
        return cookie

    def _raw(self, method: str, path: str, *, timeout=TIMEOUT, headers=None, **kwargs) -> requests.Response:
        url = self.base_url + path
        try:
            with net.purpose(allowed_hosts.PURPOSE):  # the private hosts staff allowed for ComfyUI
                return net.request(method, url, timeout=timeout, headers=headers or {}, **kwargs)
        except net.UnsafeURL as error:
            raise BadAddress(allowed_hosts.refusal(error)) from None
        except net.TooLarge as error:
            raise CheckFailed(str(error)) from None
        except NotSent as error:  # nothing reached it: refused, unresolved, TLS, connect timeout
            raise Unreachable(f"Cannot reach ComfyUI at {self.address} ({error.cause})") from None
        except requests.ConnectionError:
            raise CheckFailed(f"ComfyUI at {self.address} dropped the connection") from None
        except requests.Timeout:
            raise CheckFailed(f"ComfyUI at {self.address} did not answer in time") from None
        except requests.RequestException as error:
            raise CheckFailed(f"ComfyUI request failed: {type(error).__name__}") from None

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {**kwargs.pop("headers", {}), **self._auth_headers()}
        response = self._raw(method, path, headers=headers, **kwargs)
        if self._auth_refused(response) and "Cookie" in headers:
            with _cookies_lock:
                _cookies.pop(self._cookie_key(), None)
            headers["Cookie"] = self._login()
            response = self._raw(method, path, headers=headers, **kwargs)
        if self._auth_refused(response):
            hint = "check the password" if self.password else "the instance needs a password"
            raise AuthFailed(f"ComfyUI at {self.address} refused access (HTTP {response.status_code}): {hint}")
        return response

    @staticmethod
    def _auth_refused(response) -> bool:
        if response.status_code in (401, 403):
            return True
        return response.is_redirect and "/login" in response.headers.get("location", "")

    def _json(self, method: str, path: str, **kwargs):
        response = self._call(method, path, **kwargs)
        if response.status_code >= 500:
            raise CheckFailed(f"ComfyUI answered HTTP {response.status_code} to {method} {path.split('?')[0]}")
        if response.status_code != 200:
            raise CheckFailed(f"ComfyUI answered HTTP {response.status_code} to {method} {path.split('?')[0]}")
        try:
            return self.redact(response.json())
        except ValueError:
            raise CheckFailed(f"ComfyUI answered {method} {path.split('?')[0]} with something that is not JSON") from None

    # --- routes ---

    def system_stats(self) -> dict:
        return self._json("GET", "/system_stats")

    def queue(self) -> dict:
        """{prompt_id: "running" | "pending"} from GET /queue (items are 5-arrays)."""
        body = self._json("GET", "/queue")
        if not isinstance(body, dict):
            raise CheckFailed("ComfyUI's /queue answer is not an object")
        states = {}
        for state, key in (("pending", "queue_pending"), ("running", "queue_running")):
            for item in body.get(key) or []:
                if isinstance(item, list) and len(item) > 1:
                    states[str(item[1])] = state
        return states

    def queued_number(self, prompt_id: str) -> float | None:
        """The `number` ComfyUI gave `prompt_id` while it is queued or running, else None."""
        body = self._json("GET", "/queue")
        for key in ("queue_running", "queue_pending"):
            for item in (body.get(key) if isinstance(body, dict) else None) or []:
                if isinstance(item, list) and len(item) > 1 and str(item[1]) == prompt_id:
                    return item[0] if isinstance(item[0], int | float) else None
        return None

    def highest_number(self) -> float | None:
        """The highest prompt `number` ComfyUI holds (queued, running, or its latest history
        entry); None when it holds none. The counter only grows while the server runs and
        starts again at 0 when it restarts (17_server_restart): a prompt of ours that is
        gone, with nothing numbered at or above it, was lost to a restart."""
        numbers = []
        body = self._json("GET", "/queue")
        for key in ("queue_running", "queue_pending"):
            for item in (body.get(key) if isinstance(body, dict) else None) or []:
                if isinstance(item, list) and item and isinstance(item[0], int | float):
                    numbers.append(item[0])
        latest = self._json("GET", "/history?max_items=1")
        for entry in latest.values() if isinstance(latest, dict) else []:
            prompt = entry.get("prompt") if isinstance(entry, dict) else None
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int | float):
                numbers.append(prompt[0])
        return max(numbers) if numbers else None

    def history(self, prompt_id: str) -> dict | None:
        """The history entry of `prompt_id`, or None while ComfyUI has none (`200 {}`)."""
        body = self._json("GET", "/history/" + quote(prompt_id, safe=""))
        if not isinstance(body, dict):
            raise CheckFailed("ComfyUI's /history answer is not an object")
        entry = body.get(prompt_id)
        return entry if isinstance(entry, dict) else None

    def post_prompt(self, graph: dict, *, prompt_id: str, client_id: str, extra: dict) -> dict:
        payload = {"prompt": graph, "prompt_id": prompt_id, "client_id": client_id, "extra_data": extra}
        response = self._call(
            "POST", "/prompt", data=json.dumps(payload), headers={"Content-Type": "application/json"}, timeout=UPLOAD_TIMEOUT
        )
        if response.status_code == 400:
            try:
                body = self.redact(response.json())
            except ValueError:
                body = None
            raise Rejected(describe_rejection(body), body)
        if response.status_code != 200:
            raise CheckFailed(f"ComfyUI answered HTTP {response.status_code} to POST /prompt")
        try:
            return self.redact(response.json())
        except ValueError:
            raise CheckFailed("ComfyUI answered POST /prompt with something that is not JSON") from None

    def has_input(self, name: str, subfolder: str = UPLOAD_SUBFOLDER) -> bool:
        """Whether the instance's input folder holds `subfolder/name` (a 1-byte range read)."""
        query = urlencode({"filename": name, "subfolder": subfolder, "type": "input"})
        try:
            response = self._call("GET", f"/view?{query}", headers={"Range": "bytes=0-0"}, max_bytes=64 * 1024)
        except CheckFailed as error:
            if "cap" in error.reason:  # the server ignored Range and sent the whole file: it exists
                return True
            raise
        if response.status_code in (200, 206):
            return True
        if response.status_code == 404:
            return False
        raise CheckFailed(f"ComfyUI answered HTTP {response.status_code} to GET /view")

    def upload(self, data: bytes, name: str, *, content_type: str, subfolder: str = UPLOAD_SUBFOLDER) -> str:
        """POST /upload/image; returns what LoadImage takes ("<subfolder>/<stored name>")."""
        response = self._call(
            "POST",
            "/upload/image",
            files={"image": (name, data, content_type or "application/octet-stream")},
            data={"type": "input", "subfolder": subfolder},
            timeout=UPLOAD_TIMEOUT,
        )
        if response.status_code != 200:
            raise CheckFailed(f"ComfyUI refused the upload of {name} (HTTP {response.status_code})")
        body = response.json()
        stored, folder = body.get("name") or name, body.get("subfolder") or ""
        return f"{folder}/{stored}" if folder else stored

    def view_url(self, item: dict) -> str:
        query = urlencode(
            {"filename": item.get("filename", ""), "subfolder": item.get("subfolder", ""), "type": item.get("type", "output")}
        )
        return f"{self.base_url}/view?{query}"

    def download_headers(self) -> dict:
        return self._auth_headers()

    def interrupt(self, prompt_id: str) -> None:
        self._call("POST", "/interrupt", data=json.dumps({"prompt_id": prompt_id}), headers={"Content-Type": "application/json"})

    def delete_queued(self, prompt_ids: list[str]) -> None:
        self._call("POST", "/queue", data=json.dumps({"delete": prompt_ids}), headers={"Content-Type": "application/json"})


def describe_rejection(body) -> str:
    """A readable reason for a 400 from POST /prompt: the node, its type, the input and
    ComfyUI's message, read from `node_errors` (`error.details` is usually empty)."""
    if not isinstance(body, dict):
        return "ComfyUI rejected the workflow (HTTP 400)"
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    parts = []
    for node_id, node in (body.get("node_errors") or {}).items():
        for item in node.get("errors") or []:
            extra = item.get("extra_info") or {}
            where = f"node {node_id} ({node.get('class_type', '?')})"
            if extra.get("input_name"):
                where += f" input '{extra['input_name']}'"
            detail = item.get("details") or ""
            message = item.get("message") or item.get("type") or "invalid"
            parts.append(f"{where}: {message}" + (f" — {detail}" if detail and detail != extra.get("input_name") else ""))
    if not parts:
        message = error.get("message") or "the workflow is invalid"
        details = error.get("details") or ""
        parts.append(message + (f" ({details})" if details else ""))
    return "ComfyUI rejected the workflow: " + "; ".join(parts)


def describe_failure(entry: dict) -> tuple[str, bool]:
    """(reason, out_of_memory) for a history entry with status_str "error". An interrupt
    is told apart by the last message (ComfyUI reports it as an error too)."""
    messages = ((entry.get("status") or {}).get("messages")) or []
    for name, data in reversed(messages):
        if name == "execution_interrupted":
            node = data.get("node_id")
            return (f"the prompt was interrupted on the ComfyUI instance (at node {node} ({data.get('node_type', '?')}))", False)
        if name == "execution_error":
            kind = data.get("exception_type") or "error"
            lines = [line.strip() for line in (data.get("exception_message") or "").splitlines() if line.strip()]
            text = lines[0] if lines else ""
            oom = "OutOfMemory" in kind or "out of memory" in (data.get("exception_message") or "").lower()
            reason = f"ComfyUI error in node {data.get('node_id')} ({data.get('node_type', '?')}): {kind}: {text}".rstrip(": ")
            if oom:
                reason += " (the instance ran out of memory on the GPU)"
            return reason, oom
    return "ComfyUI reported an error for the prompt", False
