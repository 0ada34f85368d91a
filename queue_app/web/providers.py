"""Provider pages: list, create / edit (every option a real field, model aliases as rows),
delete (refused while it has work), and "Test key". Saving goes through
`provider_save`, so concurrency and pause changes wake dispatch at once."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from queue_app import limits
from queue_app.models import Family, Provider
from queue_app.providers import crypto
from queue_app.providers.catalogue import CATALOGUE
from queue_app.providers.options import OPTIONS, PRICES, clean_option, declared
from queue_app.providers.prices import prices_text
from queue_app.services import providers as provider_writes
from queue_app.services.errors import ServiceError
from queue_app.services.providers import provider_may_change, provider_save, provider_test_key, provider_work
from queue_app.web.forms import ProviderUrlMixin
from queue_app.web.shortcuts import own


class ProviderForm(ProviderUrlMixin, forms.Form):
    name = forms.CharField(max_length=100)
    family = forms.ChoiceField(choices=Family.choices)
    # A form shown again with an error keeps the key typed into it (only what this request
    # sent: a stored key is never rendered).
    api_key = forms.CharField(
        label="API key", required=False, strip=True, widget=forms.PasswordInput(render_value=True, attrs={"autocomplete": "off"})
    )
    api_secret = forms.CharField(
        label="API secret",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=True, attrs={"autocomplete": "off"}),
    )
    base_url = forms.CharField(label="Base URL", required=False, max_length=200, help_text="blank: the family's public API")
    # plain numbers here; the service says what the allowed range is, in words
    concurrency = forms.IntegerField(initial=1, help_text=f"jobs at once, 1 to {limits.CONCURRENCY.high}")
    max_attempts = forms.IntegerField(label="Max attempts", initial=4, help_text=f"1 to {limits.MAX_ATTEMPTS.high}")
    paused = forms.BooleanField(required=False)

    def __init__(self, *args, provider: Provider, **kwargs):
        self.provider = provider
        super().__init__(*args, **kwargs)
        # one field per declared option of every family; the page shows the chosen family's
        for family in OPTIONS:
            stored = provider.options if provider.family == family else {}
            for option in declared(family):
                name = f"opt_{family}_{option.name}"
                if option.type is bool:
                    field = forms.BooleanField(required=False)
                elif option.choices:
                    field = forms.ChoiceField(choices=[("", "default")] + [(c, c) for c in option.choices], required=False)
                else:  # prices: several model=price entries
                    field = forms.CharField(required=False, max_length=2000 if option is PRICES else 200)
                field.label, field.help_text, field.family = option.label, option.help, family
                field.initial = stored.get(option.name)
                if option is PRICES:  # stored as {model: price}, edited as text
                    field.initial = prices_text(field.initial)
                self.fields[name] = field

    def option_values(self) -> dict:
        """The chosen family's options as typed, for the service to check again."""
        family = self.cleaned_data["family"]
        values = {}
        for option in declared(family):
            raw = self.cleaned_data.get(f"opt_{family}_{option.name}")
            try:
                values[option.name] = clean_option(option, False if raw is False and option.type is bool else raw)
            except ValueError as error:
                self.add_error(f"opt_{family}_{option.name}", str(error))
        return values


def alias_rows(request, provider: Provider) -> list[tuple[str, str]]:
    if request.method == "POST":
        return list(zip(request.POST.getlist("alias"), request.POST.getlist("alias_model"), strict=False))
    return list((provider.model_aliases or {}).items())


def initial_of(provider: Provider) -> dict:
    if not provider.pk:
        return {"concurrency": 1, "max_attempts": provider.max_attempts}
    return {
        "name": provider.name,
        "family": provider.family,
        "base_url": provider.base_url,
        "concurrency": provider.concurrency,
        "max_attempts": provider.max_attempts,
        "paused": provider.paused,
    }


@login_required
def provider_list(request):
    providers = Provider.objects.filter(owner=request.user)
    return render(request, "queue_app/provider_list.html", {"providers": providers, "families": Family.choices})


@login_required
def provider_edit(request, provider_id=None):
    provider = own(Provider, request.user, id=provider_id) if provider_id else Provider(owner=request.user)
    form = ProviderForm(request.POST or None, provider=provider, initial=initial_of(provider))
    rows = alias_rows(request, provider)
    if request.method == "POST" and form.is_valid():
        options = form.option_values()
        aliases = {alias.strip(): model for alias, model in rows if alias.strip()}
        data = {
            key: form.cleaned_data[key]
            for key in ("name", "family", "base_url", "api_key", "api_secret", "concurrency", "max_attempts", "paused")
        }
        if provider.pk and data["base_url"] == provider.base_url:
            data.pop("base_url")
        data.update(options=options, model_aliases=aliases)
        if not form.errors:
            try:
                saved = provider_save(user=request.user, provider=provider if provider.pk else None, data=data)
                messages.success(request, f"provider “{saved.name}” saved")
                return redirect("provider_edit", provider_id=saved.id)
            except ServiceError as error:
                form.add_error(None, error.message)
    family_models = {family: list(models) for family, models in CATALOGUE.items()}
    return render(
        request,
        "queue_app/provider_edit.html",
        {
            "form": form,
            "provider": provider,
            "key_hint": crypto.hint(provider.api_key) if provider.pk else "",
            "alias_rows": rows + [("", "")],
            "family_models": family_models,
            "families": [family for family, _ in Family.choices],
            "may_change": not provider.pk or provider_may_change(request.user, provider),
            "work": provider_work(provider) if provider.pk else None,
        },
    )


@login_required
@require_POST
def provider_test(request, provider_id):
    provider = own(Provider, request.user, id=provider_id)
    try:
        result = provider_test_key(user=request.user, provider_id=provider.id)
    except ServiceError as refusal:
        messages.error(request, refusal.message)
        return redirect("provider_edit", provider_id=provider.id)
    (messages.success if result["result"] == "ok" else messages.error)(request, f"Test key: {result['message']}")
    return redirect("provider_edit", provider_id=provider.id)


@login_required
def provider_delete(request, provider_id):
    """GET: what it still has to do; POST: delete it (refused while it has work)."""
    provider = own(Provider, request.user, id=provider_id)
    if request.method == "POST":
        try:
            provider_writes.provider_delete(user=request.user, provider_id=provider.id)
            messages.success(request, f"provider “{provider.name}” deleted")
            return redirect("provider_list")
        except ServiceError as error:
            messages.error(request, error.message)
    return render(
        request,
        "queue_app/provider_delete.html",
        {"provider": provider, "work": provider_work(provider), "projects": provider.projects.count()},
    )
