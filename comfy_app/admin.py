from django import forms
from django.contrib import admin

from comfy_app.models import ComfyAllowedHost, ComfyInstance, ComfyRun, ComfyUpload
from queue_app import limits


class Admin(admin.ModelAdmin):
    """JSON columns (workflow, bindings) edited through the bounded field."""

    formfield_overrides = limits.ADMIN_FORMFIELDS


class ComfyInstanceForm(forms.ModelForm):
    # Write-only: the stored password is never rendered back.
    new_password = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False), label="Password")

    class Meta:
        model = ComfyInstance
        fields = ["project", "base_url", "username", "workflow", "bindings", "include_video"]

    def clean_base_url(self):
        """The address as the settings page takes it (the outbound guard, no query)."""
        from comfy_app.services import check_address
        from queue_app.services.errors import ServiceError

        try:
            return check_address(self.cleaned_data.get("base_url") or "")
        except ServiceError as error:
            raise forms.ValidationError(error.message) from None

    def clean(self):
        # A stored password is only ever sent to the address it was saved for.
        data = super().clean()
        stored = self.instance.pk and self.instance.password_encrypted
        if stored and "base_url" in data and data["base_url"] != self.instance.base_url and not data.get("new_password"):
            self.add_error("new_password", "to change the address, enter the password again")
        return data

    def save(self, commit=True):
        instance = super().save(commit=False)
        if self.cleaned_data.get("new_password"):
            instance.password = self.cleaned_data["new_password"]
        if commit:
            instance.save()
        return instance


@admin.register(ComfyInstance)
class ComfyInstanceAdmin(Admin):
    form = ComfyInstanceForm
    list_display = ["project", "base_url", "driver", "unreachable_since", "last_checked_at"]
    readonly_fields = ["client_id", "driver", "driver_until", "unreachable_since", "back_at", "last_error", "last_checked_at"]


@admin.register(ComfyRun)
class ComfyRunAdmin(Admin):
    list_display = ["job", "project", "phase", "remote_state", "posted_at", "finished_at"]
    list_filter = ["phase"]
    readonly_fields = [field.name for field in ComfyRun._meta.fields]


class ComfyAllowedHostForm(forms.ModelForm):
    class Meta:
        model = ComfyAllowedHost
        fields = ["address", "allow_http", "note"]

    def clean(self):
        data = super().clean()
        if not self.instance.pk and ComfyAllowedHost.objects.count() >= limits.COMFY_ALLOWED_HOSTS:
            limit = limits.COMFY_ALLOWED_HOSTS
            raise forms.ValidationError(f"at most {limit} hosts may be allowed for ComfyUI: remove one first")
        return data


@admin.register(ComfyAllowedHost)
class ComfyAllowedHostAdmin(Admin):
    """Private hosts ComfyUI instances may be at (effective at once, ComfyUI calls only)."""

    form = ComfyAllowedHostForm

    list_display = ["address", "allow_http", "note", "created_by", "created_at"]
    readonly_fields = ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        from comfy_app.allowed_hosts import normalise

        obj.address = normalise(obj.address)[0]
        if not obj.created_by_id:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(ComfyUpload)
class ComfyUploadAdmin(Admin):
    list_display = ["name", "instance", "address", "stored_as", "created_at"]
    readonly_fields = [field.name for field in ComfyUpload._meta.fields]
