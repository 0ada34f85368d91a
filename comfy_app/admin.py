from django import forms
from django.contrib import admin

from comfy_app.models import ComfyAllowedHost, ComfyInstance, ComfyRun, ComfyUpload


class ComfyInstanceForm(forms.ModelForm):
    # Write-only: the stored password is never rendered back.
    new_password = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False), label="Password")

    class Meta:
        model = ComfyInstance
        fields = ["project", "base_url", "username", "workflow", "bindings", "include_video"]

    def save(self, commit=True):
        instance = super().save(commit=False)
        if self.cleaned_data.get("new_password"):
            instance.password = self.cleaned_data["new_password"]
        if commit:
            instance.save()
        return instance


@admin.register(ComfyInstance)
class ComfyInstanceAdmin(admin.ModelAdmin):
    form = ComfyInstanceForm
    list_display = ["project", "base_url", "driver", "unreachable_since", "last_checked_at"]
    readonly_fields = ["client_id", "driver", "driver_until", "unreachable_since", "back_at", "last_error", "last_checked_at"]


@admin.register(ComfyRun)
class ComfyRunAdmin(admin.ModelAdmin):
    list_display = ["job", "project", "phase", "remote_state", "posted_at", "finished_at"]
    list_filter = ["phase"]
    readonly_fields = [field.name for field in ComfyRun._meta.fields]


@admin.register(ComfyAllowedHost)
class ComfyAllowedHostAdmin(admin.ModelAdmin):
    """Private hosts ComfyUI instances may be at (effective at once, ComfyUI calls only)."""

    list_display = ["address", "allow_http", "note", "created_by", "created_at"]
    readonly_fields = ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        from comfy_app.allowed_hosts import normalise

        obj.address = normalise(obj.address)[0]
        if not obj.created_by_id:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(ComfyUpload)
class ComfyUploadAdmin(admin.ModelAdmin):
    list_display = ["name", "instance", "address", "stored_as", "created_at"]
    readonly_fields = [field.name for field in ComfyUpload._meta.fields]
