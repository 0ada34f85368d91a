"""A provider's base URL as a form checks it: the admin's provider form and the provider
page's form both mix this in (the check was copied between them)."""

from django import forms

from queue_app.providers import net


class CleansBaseUrl:
    """For a ModelForm with a `base_url` field: the outbound guard's verdict, normalised."""

    def clean_base_url(self):
        url = self.cleaned_data.get("base_url")
        if url:
            try:
                return net.validate_base_url(url)
            except ValueError as error:
                raise forms.ValidationError(str(error)) from None
        return url
