"""The ComfyUI settings page of a project and its "test connection" action. Thin: parse,
call one service, render. Another user's project answers 404."""

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from comfy_app import allowed_hosts, services, setup
from comfy_app.workflow import KINDS, WorkflowError
from queue_app.models import Kind, Project
from queue_app.selectors.visibility import visible_to
from queue_app.services.errors import ServiceError


def own_comfy_project(user, project_id) -> Project:
    return get_object_or_404(visible_to(user, Project), id=project_id, kind=Kind.COMFYUI)


class ComfySettingsForm(forms.Form):
    base_url = forms.CharField(label="Instance address", max_length=500, required=False)
    username = forms.CharField(max_length=200, required=False)
    password = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=True, attrs={"autocomplete": "off"}),  # kept when shown again
        help_text="Write-only. A bcrypt hash is sent as a Bearer token, anything else logs in through ComfyUI-Login.",
    )
    clear_password = forms.BooleanField(required=False, label="Remove the stored password")
    workflow = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}),
        required=False,
        help_text="API format: in ComfyUI, Workflow → Export (API).",
    )
    bindings = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        required=False,
        help_text='A list of {"source": "prompt" | "params.<name>" | "references.<n>", "node": "6", "input": "text", '
        f'"kind": {" | ".join(KINDS)}}}. Seeds left unbound are re-rolled per job.',
    )
    include_video = forms.BooleanField(required=False, label="Also store video outputs")
    workflow_file = forms.FileField(
        required=False,
        label="…or upload the workflow",
        help_text="The .json ComfyUI exports with “Save (API Format)”; it replaces the text above.",
        widget=forms.ClearableFileInput(attrs={"accept": ".json,application/json"}),
    )


@login_required
def comfy_settings(request, project_id):
    """Save, or ("Test connection") test what the form holds and show it again, kept."""
    project = own_comfy_project(request.user, project_id)
    instance = services.instance_of(project)
    initial = {
        "base_url": instance.base_url,
        "username": instance.username,
        "workflow": json.dumps(instance.workflow, indent=2) if instance.workflow else "",
        "bindings": json.dumps(instance.bindings, indent=2) if instance.bindings else "",
        "include_video": instance.include_video,
    }
    form = ComfySettingsForm(request.POST or None, request.FILES or None, initial=initial)
    test_result = None
    workflow, bindings = instance.workflow, instance.bindings
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            workflow_text, workflow, bindings = _posted_setup(request, data)
        except (ServiceError, WorkflowError) as error:
            form.add_error(None, getattr(error, "message", None) or str(error))
        else:
            if request.POST.get("action") == "test":
                test_result = _tested(
                    request.user, project, base_url=data["base_url"], username=data["username"], password=data["password"] or None
                )
                kept = {**data, "workflow": workflow_text, "bindings": json.dumps(bindings, indent=2) if bindings else ""}
                form = ComfySettingsForm(initial={k: v for k, v in kept.items() if k not in ("password", "workflow_file")})
            else:
                saved, form = _save(request, project, data, workflow_text, bindings, initial)
                if saved:
                    return redirect("comfy_settings", project_id=project.id)
    if request.POST.get("action") == "test" and request.headers.get("X-Requested-With") == "fetch":
        # the page's background test: the answer alone (the form's own errors when it has any)
        if test_result is None:
            errors = [str(e) for field_errors in form.errors.values() for e in field_errors]
            return JsonResponse({"ok": False, "text": "; ".join(errors) or "the form has errors"})
        return JsonResponse({"ok": test_result["ok"], "text": connection_text(test_result)})
    context = {
        "project": project,
        "instance": instance,
        "form": form,
        "password_hint": "set" if instance.password_encrypted else "",
        "test_result": test_result,
        "connection_text": connection_text(test_result) if test_result else "",
        "picker": setup.picker_rows(workflow if isinstance(workflow, dict) else {}, bindings or []),
        "choices": [(name, label) for name, (_, _, label) in setup.CHOICES.items()],
        "allowed_hosts_where": allowed_hosts.WHERE,
    }
    return render(request, "comfy_app/settings.html", context)


def _save(request, project, data: dict, workflow_text: str, bindings, initial: dict) -> tuple[bool, ComfySettingsForm | None]:
    """(saved, the form shown again when not): a refusal (an address not allowed, say)
    keeps all that was sent, the uploaded workflow included."""
    try:
        services.comfy_settings_save(
            user=request.user,
            project=project,
            base_url=data["base_url"],
            username=data["username"],
            password=data["password"] or None,
            clear_password=data["clear_password"],
            workflow_json=workflow_text,
            bindings=bindings,
            include_video=data["include_video"],
        )
    except ServiceError as error:
        form = _form_kept(request, initial, workflow_text, bindings)
        form.add_error(None, error.message)
        return False, form
    messages.success(request, "ComfyUI settings saved")
    return True, None


def _form_kept(request, initial: dict, workflow_text: str, bindings) -> ComfySettingsForm:
    """The posted form shown again with the workflow as it was read: an uploaded file's
    text goes into the workflow field, since a file input cannot be filled again."""
    data = request.POST.copy()
    data["workflow"] = workflow_text
    data["bindings"] = json.dumps(bindings, indent=2) if bindings else ""
    form = ComfySettingsForm(data, initial=initial)
    form.is_valid()
    return form


def connection_text(result: dict) -> str:
    """What a connection test found, in one sentence (the client's own reason already
    names the address when it could not reach it)."""
    if result["ok"]:
        free = result.get("vram_free")
        vram = f", {free / 1024**3:.1f} GB VRAM free" if isinstance(free, int | float) and free else ""
        return f"Connected to ComfyUI {result['version']} on {result['device']}{vram}. Nothing is saved yet."
    url, error = result.get("url") or "", result.get("error") or "no answer"
    return error if url and url in error else f"Cannot connect to {url or 'ComfyUI'}: {error}"


def _tested(user, project, **form) -> dict:
    """The connection test's result; a user who may only see the project gets the refusal
    as the result (nothing is sent anywhere)."""
    try:
        return services.comfy_test_connection(user=user, project=project, **form)
    except ServiceError as refusal:
        return {"ok": False, "url": "", "error": refusal.message}


def _posted_setup(request, data) -> tuple[str, dict, list]:
    """(workflow text, workflow, bindings) from the form: an uploaded file replaces the
    pasted workflow; the picker's choices merge into the raw bindings."""
    workflow_text = data["workflow"]
    if data.get("workflow_file"):
        workflow_text = setup.read_workflow_file(data["workflow_file"])
    workflow, bindings = services.parsed_setup(workflow_text, data["bindings"])
    if isinstance(workflow, dict) and isinstance(bindings, list):
        bindings = setup.merge_picker(request.POST, bindings, workflow)
    return workflow_text, workflow if isinstance(workflow, dict) else {}, bindings


@login_required
@require_POST
def comfy_test(request, project_id):
    project = own_comfy_project(request.user, project_id)
    result = _tested(request.user, project, base_url=request.POST.get("base_url") or None)
    if request.headers.get("accept", "").startswith("application/json"):
        return JsonResponse(result)
    (messages.success if result["ok"] else messages.error)(request, connection_text(result))
    return redirect("comfy_settings", project_id=project.id)


@login_required
def allowed_hosts_page(request):
    """Staff see the private hosts ComfyUI instances may be at; adding or removing one
    (effective at once, for everyone) needs its permission (services.allowed_host_*)."""
    if not request.user.is_staff:
        raise Http404
    if request.method == "POST":
        try:
            if request.POST.get("remove"):
                services.allowed_host_remove(user=request.user, host_id=int(request.POST["remove"]))
                messages.success(request, "Host removed")
            else:
                row = services.allowed_host_add(
                    user=request.user,
                    address=request.POST.get("address", ""),
                    allow_http=bool(request.POST.get("allow_http")),
                    note=request.POST.get("note", ""),
                )
                messages.success(request, f"ComfyUI instances at {row.address} are allowed")
        except (ServiceError, ValueError) as error:
            messages.error(request, getattr(error, "message", None) or str(error))
        return redirect("comfy_allowed_hosts")
    return render(request, "comfy_app/allowed_hosts.html", {"hosts": services.allowed_hosts_list()})
