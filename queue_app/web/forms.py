"""Form pieces shared by the admin and the pages (one home each)."""

from django import forms

from queue_app.services.errors import ServiceError
from queue_app.services.providers import base_url_checked, key_moves


class ProviderUrlMixin:
    """A provider form's base URL: checked by `base_url_checked` (the outbound
    guard), and on a provider that exists, its key's address (base URL or family) changed
    only together with the key."""

    def clean_base_url(self):
        try:
            return base_url_checked(self.cleaned_data.get("base_url"))
        except ServiceError as error:
            raise forms.ValidationError(error.message) from None

    def clean(self):
        data = super().clean()
        instance = getattr(self, "instance", None) or getattr(self, "provider", None)
        if instance is not None and instance.pk and not data.get("api_key"):
            moved = {name: data[name] for name in ("family", "base_url") if name in data}
            if key_moves(instance, moved):
                self.add_error("api_key", "to change the base URL or the family, enter the API key again")
        return data
