"""Write services and the connection test of ComfyUI project settings."""

from django.core.exceptions import ValidationError

from comfy_app import allowed_hosts, workflow
from comfy_app import client as comfy
from comfy_app.models import ComfyAllowedHost, ComfyInstance
from queue_app import limits
from queue_app.models import Kind, Project
from queue_app.providers import net
from queue_app.providers.addresses import plain_address
from queue_app.services.acting import acting_on
from queue_app.services.errors import ServiceError

# Changing another user's instance, or testing it with its stored password, needs this.
CHANGE_INSTANCE = "comfy_app.change_comfyinstance"


def _own_comfy_project(user, project: Project) -> Project:
    """A ComfyUI project the user may act on (selectors/visibility.py's rule)."""
    acting_on(user, project, noun="project", permission=CHANGE_INSTANCE)
    if project.kind != Kind.COMFYUI:
        raise ServiceError("this project is not a ComfyUI project")
    return project


def instance_of(project: Project) -> ComfyInstance:
    return ComfyInstance.objects.get_or_create(project=project)[0]


def check_address(url: str) -> str:
    """An instance address: scheme, host, port and path only, through the outbound guard
    (a private host must be allowed by staff first)."""
    url = comfy.normalise_url(url)
    if not url:
        return ""
    try:
        plain_address(url)
    except ValueError as error:
        raise ServiceError(f"the ComfyUI address is not allowed: {error}") from None
    try:
        with net.purpose(allowed_hosts.PURPOSE):
            net.check_url(url)
    except net.UnsafeURL as error:
        raise ServiceError(allowed_hosts.refusal(error)) from None
    return url


def comfy_settings_save(
    *,
    user,
    project: Project,
    base_url: str,
    workflow_json,
    bindings,
    username: str = "",
    password: str | None = None,
    clear_password: bool = False,
    include_video: bool = False,
) -> ComfyInstance:
    """Save a project's ComfyUI settings. The password is write-only: None keeps it."""
    _own_comfy_project(user, project)
    workflow_json, bindings = parsed_setup(workflow_json, bindings)
    try:
        limits.check_workflow(workflow_json or {})
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages)) from None
    try:
        if workflow_json:
            workflow.validate_workflow(workflow_json)
        bindings = workflow.validate_bindings(bindings or [], workflow_json or {})
    except workflow.WorkflowError as error:
        raise ServiceError(str(error)) from None
    instance = instance_of(project)
    new_url = check_address(base_url)
    # a stored password never follows a new address silently (issue 18 §5)
    if instance.password and new_url != instance.base_url and not password and not clear_password:
        raise ServiceError("to change the ComfyUI address, enter the password again (or clear it)")
    instance.base_url = new_url
    instance.username = (username or "").strip()
    if clear_password:
        instance.password = ""
    elif password:
        instance.password = password
    instance.workflow = workflow_json or {}
    instance.node_order = list(workflow_json or {})
    instance.bindings = bindings
    instance.include_video = include_video
    instance.save()
    return instance


def parsed_setup(workflow_json, bindings) -> tuple:
    """The workflow and bindings as JSON values (text is parsed: deep nesting is a refusal)."""
    try:
        if isinstance(workflow_json, str):
            workflow_json = limits.parse_json_text(
                workflow_json, label="the workflow", empty={}, max_bytes=limits.WORKFLOW_BYTES, max_depth=limits.WORKFLOW_DEPTH
            )
        if isinstance(bindings, str):
            bindings = limits.parse_json_text(bindings, label="the bindings", empty=[], max_depth=limits.WORKFLOW_DEPTH)
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages)) from None
    return workflow_json, bindings


def comfy_test_connection(
    *, user, project: Project, base_url: str | None = None, username: str | None = None, password: str | None = None
) -> dict:
    """{ok, url, version, device, vram_total, vram_free} or {ok: False, url, error}. Tests
    what the form holds (address, user, password) where given, the saved values otherwise.
    The stored password goes only to the address it was saved for: testing another address
    takes the password typed in the form, or none. Refused (ServiceError) for a user who
    may only see the project."""
    _own_comfy_project(user, project)
    instance = instance_of(project)
    url = comfy.normalise_url(base_url if base_url else instance.base_url)
    username = instance.username if username is None else username
    if not password and url == comfy.normalise_url(instance.base_url):
        password = instance.password
    try:
        check_address(url)
        if not url:
            raise ServiceError("no ComfyUI address is set")
        client = comfy.ComfyClient(url, username=username, password=password)
        stats = client.system_stats()
    except ServiceError as error:
        return {"ok": False, "url": url, "error": error.message}
    except comfy.ComfyError as error:
        return {"ok": False, "url": url, "error": error.reason}
    system = stats.get("system") or {}
    device = (stats.get("devices") or [{}])[0]
    return {
        "ok": True,
        "url": url,
        "version": system.get("comfyui_version", "unknown"),
        "device": device.get("name", "unknown"),
        "device_type": device.get("type", ""),
        "vram_total": device.get("vram_total"),
        "vram_free": device.get("vram_free"),
    }


# --- private hosts staff allow for ComfyUI instances ------------------------------------


def _may(user, action: str) -> None:
    """The allowed hosts are a global setting: changing them needs its Django permission
    (staff alone only see the list)."""
    if not (user and user.has_perm(f"comfy_app.{action}_comfyallowedhost")):
        raise ServiceError(f"you may see the hosts allowed for ComfyUI but not {action} them: that needs its permission", 403)


def allowed_host_add(*, user, address: str, allow_http: bool = True, note: str = "") -> ComfyAllowedHost:
    """Allow ComfyUI instances at a private or local host; effective at once, ComfyUI only.
    At most limits.COMFY_ALLOWED_HOSTS entries: every ComfyUI check reads the list."""
    _may(user, "add")
    try:
        host, scheme_http = allowed_hosts.normalise(address)
    except ValueError as error:
        raise ServiceError(str(error)) from None
    if scheme_http is not None:
        allow_http = scheme_http
    known = ComfyAllowedHost.objects.filter(address=host).exists()
    if not known and ComfyAllowedHost.objects.count() >= limits.COMFY_ALLOWED_HOSTS:
        raise ServiceError(f"at most {limits.COMFY_ALLOWED_HOSTS} hosts may be allowed for ComfyUI: remove one first")
    row, _ = ComfyAllowedHost.objects.update_or_create(
        address=host, defaults={"allow_http": allow_http, "note": (note or "")[:200], "created_by": user}
    )
    return row


def allowed_host_remove(*, user, host_id: int) -> bool:
    _may(user, "delete")
    return bool(ComfyAllowedHost.objects.filter(id=host_id).delete()[0])


def allowed_hosts_list() -> list:
    return list(ComfyAllowedHost.objects.select_related("created_by"))
