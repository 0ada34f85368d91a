from django import forms
from django.contrib import admin

from comfy_app.models import ComfyInstance, ComfyRun


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
    readonly_fields = ["client_id", "driver", "driver_until", "unreachable_since", "last_error", "last_checked_at"]


@admin.register(ComfyRun)
class ComfyRunAdmin(admin.ModelAdmin):
    list_display = ["job", "project", "phase", "remote_state", "posted_at", "finished_at"]
    list_filter = ["phase"]
    readonly_fields = [field.name for field in ComfyRun._meta.fields]
