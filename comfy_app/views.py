"""The ComfyUI settings page of a project and its "test connection" action. Thin: parse,
call one service, render. Another user's project answers 404."""

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from comfy_app import services
from comfy_app.workflow import KINDS
from queue_app import selectors
from queue_app.models import Kind, Project
from queue_app.services import ServiceError


def own_comfy_project(user, project_id) -> Project:
    return get_object_or_404(selectors.visible_to(user, Project), id=project_id, kind=Kind.COMFYUI)


class ComfySettingsForm(forms.Form):
    base_url = forms.CharField(label="Instance address", max_length=500, required=False)
    username = forms.CharField(max_length=200, required=False)
    password = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
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


@login_required
def comfy_settings(request, project_id):
    project = own_comfy_project(request.user, project_id)
    instance = services.instance_of(project)
    initial = {
        "base_url": instance.base_url,
        "username": instance.username,
        "workflow": json.dumps(instance.workflow, indent=2) if instance.workflow else "",
        "bindings": json.dumps(instance.bindings, indent=2) if instance.bindings else "",
        "include_video": instance.include_video,
    }
    form = ComfySettingsForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            services.comfy_settings_save(
                user=request.user,
                project=project,
                base_url=data["base_url"],
                username=data["username"],
                password=data["password"] or None,
                clear_password=data["clear_password"],
                workflow_json=data["workflow"],
                bindings=data["bindings"],
                include_video=data["include_video"],
            )
            messages.success(request, "ComfyUI settings saved")
            return redirect("comfy_settings", project_id=project.id)
        except ServiceError as error:
            form.add_error(None, error.message)
    return render(
        request,
        "comfy_app/settings.html",
        {"project": project, "instance": instance, "form": form, "password_hint": "set" if instance.password_encrypted else ""},
    )


@login_required
@require_POST
def comfy_test(request, project_id):
    project = own_comfy_project(request.user, project_id)
    result = services.comfy_test_connection(user=request.user, project=project, base_url=request.POST.get("base_url") or None)
    if request.headers.get("accept", "").startswith("application/json"):
        return JsonResponse(result)
    if result["ok"]:
        free = result["vram_free"]
        messages.success(
            request,
            f"Connected to ComfyUI {result['version']} on {result['device']}"
            + (f", {free / 1024**3:.1f} GB VRAM free" if isinstance(free, int | float) else ""),
        )
    else:
        messages.error(request, f"Cannot connect to {result['url'] or 'ComfyUI'}: {result['error']}")
    return redirect("comfy_settings", project_id=project.id)
