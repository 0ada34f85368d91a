"""Form pieces shared by the admin and the pages (one home each)."""

from django import forms

from queue_app.services.errors import ServiceError
from queue_app.services.providers import base_url_checked


class ProviderUrlMixin:
    """A provider form's base URL: checked by `base_url_checked` (the outbound
    guard), and on a provider that exists, changed only together with its key."""

    def clean_base_url(self):
        try:
            return base_url_checked(self.cleaned_data.get("base_url"))
        except ServiceError as error:
            raise forms.ValidationError(error.message) from None

    def clean(self):
        data = super().clean()
        instance = getattr(self, "instance", None) or getattr(self, "provider", None)
        if instance is not None and instance.pk and "base_url" in data and data["base_url"] != instance.base_url:
            if not data.get("api_key"):
                self.add_error("api_key", "to change the base URL, enter the API key again")
        return data
