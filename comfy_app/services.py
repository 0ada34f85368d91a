"""Write services and the connection test of ComfyUI project settings."""

import json

from django.core.exceptions import ValidationError

from comfy_app import allowed_hosts, workflow
from comfy_app import client as comfy
from comfy_app.models import ComfyAllowedHost, ComfyInstance
from queue_app import limits
from queue_app.models import Kind, Project
from queue_app.providers import net
from queue_app.selectors.visibility import may_see
from queue_app.services.errors import ServiceError


def _own_comfy_project(user, project: Project) -> Project:
    if not may_see(user, project):
        raise ServiceError("project not found", 404)
    if project.kind != Kind.COMFYUI:
        raise ServiceError("this project is not a ComfyUI project")
    return project


def instance_of(project: Project) -> ComfyInstance:
    return ComfyInstance.objects.get_or_create(project=project)[0]


def check_address(url: str) -> str:
    url = comfy.normalise_url(url)
    if not url:
        return ""
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
    if isinstance(workflow_json, str):
        try:
            workflow_json = json.loads(workflow_json) if workflow_json.strip() else {}
        except ValueError as error:
            raise ServiceError(f"the workflow is not valid JSON: {error}") from None
    if isinstance(bindings, str):
        try:
            bindings = json.loads(bindings) if bindings.strip() else []
        except ValueError as error:
            raise ServiceError(f"the bindings are not valid JSON: {error}") from None
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
    if project.owner_id != user.id and not (user.is_superuser or user.has_perm("comfy_app.change_comfyinstance")):
        raise ServiceError("you may see these settings but not change them: the project belongs to another user", 403)
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


def comfy_test_connection(
    *, user, project: Project, base_url: str | None = None, username: str | None = None, password: str | None = None
) -> dict:
    """{ok, url, version, device, vram_total, vram_free} or {ok: False, url, error}. Tests
    what the form holds (address, user, password) where given, the saved values otherwise."""
    _own_comfy_project(user, project)
    instance = instance_of(project)
    url = comfy.normalise_url(base_url if base_url else instance.base_url)
    username = instance.username if username is None else username
    password = password or instance.password
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


def _staff(user) -> None:
    if not (user and user.is_staff):
        raise ServiceError("only staff can change the hosts allowed for ComfyUI", 403)


def allowed_host_add(*, user, address: str, allow_http: bool = True, note: str = "") -> ComfyAllowedHost:
    """Allow ComfyUI instances at a private or local host; effective at once, ComfyUI only."""
    _staff(user)
    try:
        host, scheme_http = allowed_hosts.normalise(address)
    except ValueError as error:
        raise ServiceError(str(error)) from None
    if scheme_http is not None:
        allow_http = scheme_http
    row, _ = ComfyAllowedHost.objects.update_or_create(
        address=host, defaults={"allow_http": allow_http, "note": (note or "")[:200], "created_by": user}
    )
    return row


def allowed_host_remove(*, user, host_id: int) -> bool:
    _staff(user)
    return bool(ComfyAllowedHost.objects.filter(id=host_id).delete()[0])


def allowed_hosts_list() -> list:
    return list(ComfyAllowedHost.objects.select_related("created_by"))
