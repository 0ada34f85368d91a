"""Prices and the estimate before Start (issue 27): every default in its unit with its date
and page, a record's own prices and currency, unknown never 0, and the same figures on the
project page, the JSON API and the MCP tools."""

import json
from decimal import Decimal

import pytest
from django.test import Client

from queue_app.models import Provider
from queue_app.providers import prices
from queue_app.providers.catalogue import CATALOGUE
from queue_app.providers.options import clean_options
from queue_app.selectors.estimate import start_estimate
from queue_app.services.errors import ServiceError
from queue_app.services.providers import provider_save
from queue_app.web import mcp_tools, tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def cost_of(family, model, options=None, **settings):
    price = prices.price_for(family, model, options)
    return prices.job_cost(price, settings, prompt=settings.pop("prompt", ""), currency=prices.record_currency(family, options))


def test_every_default_names_its_unit_date_and_page_and_a_catalogue_model():
    for family, table in prices.DEFAULTS.items():
        for model, price in table.items():
            assert model in CATALOGUE[family], (family, model)
            assert price.unit in prices.UNITS and price.as_of and price.source, (family, model)
            assert all(amount >= 0 for amount in price.amounts.values())


def test_openai_images_are_priced_by_quality_and_size_and_auto_at_the_most_it_can_cost():
    assert cost_of("openai", "gpt-image-1", quality="high", aspect_ratio="1024x1024").amount == Decimal("0.167")
    assert cost_of("openai", "gpt-image-1", quality="low", aspect_ratio="1536x1024").amount == Decimal("0.016")
    assert cost_of("openai", "gpt-image-1", quality="auto", aspect_ratio="1024x1536").amount == Decimal("0.25")


def test_video_is_priced_per_second_and_text_per_million_tokens():
    assert cost_of("openai", "sora-2", duration=8).amount == Decimal("0.8")
    assert cost_of("google", "veo-3.1-generate-preview", resolution="4k", duration=4).amount == Decimal("2.4")
    # 400 characters ≈ 100 input tokens, 500 output tokens (max_tokens): 100×2.5 + 500×10 per 1M
    text = cost_of("openai", "gpt-4o", prompt="x" * 400, max_tokens=500)
    assert text.amount == Decimal("0.00525") and text.detail == {"input_tokens": 100, "output_tokens": 500}


def test_an_unknown_price_is_unknown_never_zero():
    assert cost_of("civitai", "urn:air:sdxl:checkpoint:civitai:101055@128078").amount is None
    assert cost_of("runninghub", "workflow").currency == "coins"
    assert cost_of("openai", "my-fine-tune").amount is None
    # a video without a duration cannot be priced per second
    assert cost_of("openai", "sora-2").amount is None


def test_a_record_overrides_prices_and_names_its_currency_without_exchange_rates():
    eur = {"currency": "EUR"}
    assert cost_of("openai", "gpt-image-1", eur, quality="high").amount is None  # the default is in USD
    own = {"currency": "EUR", "prices": {"gpt-image-1": "0.15", "*": "0.02"}}
    cost = cost_of("openai", "gpt-image-1", own, quality="high")
    assert (cost.amount, cost.currency, cost.unit) == (Decimal("0.15"), "EUR", "image")
    assert cost_of("openai", "dall-e-3", own).amount == Decimal("0.02")
    buzz = cost_of("civitai", "urn:air:flux1:checkpoint:civitai:618692@691639", {"prices": {"*": "4"}})
    assert (buzz.amount, buzz.currency) == (Decimal("4"), "Buzz")
    tokens_own = cost_of("openai", "gpt-4o", {"prices": {"gpt-4o": "1/4"}}, prompt="x" * 4000, max_tokens=1000)
    assert tokens_own.amount == Decimal("0.005")
    hardware = cost_of("replicate", "me/custom", {"prices": {"me/custom": "0.001/s@20"}})
    assert (hardware.amount, hardware.unit) == (Decimal("0.02"), "hardware_second")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"prices": "gpt-image-1=-1"}, "0 or more"),
        ({"prices": "gpt-image-1=cheap"}, "not a price"),
        ({"prices": "gpt-image-1"}, "model=price"),
        ({"prices": {"sora-2": "NaN"}}, "0 or more"),
        ({"currency": "DOGE"}, "Currency must be one of"),
    ],
)
def test_bad_prices_and_currencies_are_refused_with_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        clean_options("openai", options)


def test_prices_typed_as_text_are_stored_per_model(owner):
    provider = make_provider(owner, name="OpenAI", family="openai")
    saved = provider_save(
        user=owner, provider=provider, data={"options": {"prices": "gpt-image-1=0.05; sora-2=0.2", "currency": "EUR"}}
    )
    saved.refresh_from_db()
    assert saved.options["prices"] == {"gpt-image-1": "0.05", "sora-2": "0.2"} and saved.options["currency"] == "EUR"
    with pytest.raises(ServiceError, match="not a price"):
        provider_save(user=owner, provider=provider, data={"options": {"prices": "sora-2=-0.1"}})


@pytest.fixture
def mixed(owner):
    """Drafts on two records: OpenAI in USD, Civitai with no price set."""
    openai = make_provider(owner, name="OpenAI", family="openai")
    civitai = make_provider(owner, name="Civitai", family="civitai")
    project = make_project(owner, openai, model="gpt-image-1", quality="high", aspect_ratio="1:1")
    make_drafts(project, 3)
    make_drafts(project, 2, provider=civitai, model="urn:air:sdxl:checkpoint:civitai:101055@128078")
    return project


def test_the_estimate_sums_per_provider_and_currency_and_counts_unknown_apart(mixed):
    estimate = start_estimate(mixed)
    rows = {row["provider_name"]: row for row in estimate["by_provider"]}
    assert rows["OpenAI"]["amount"] == "0.50"  # 3 × 0.167, shown in cents
    assert rows["OpenAI"]["currency"] == "USD" and rows["OpenAI"]["unknown"] == 0
    assert rows["Civitai"]["amount"] is None and rows["Civitai"]["unknown"] == 2 and rows["Civitai"]["currency"] == "Buzz"
    assert estimate["totals"] == {"USD": "0.50"} and estimate["unknown"] == 2 and estimate["jobs"] == 5
    Provider.objects.filter(name="Civitai").update(options={"prices": {"*": "4"}})
    assert start_estimate(mixed)["totals"] == {"USD": "0.50", "Buzz": "8.00"}


def test_the_project_page_shows_the_estimate_beside_the_storage(mixed, owner):
    client = Client()
    client.force_login(owner)
    page = client.get(f"/projects/{mixed.id}/").content.decode()
    assert 'id="cost-start"' in page and "0.50 USD" in page and "on Civitai" in page
    assert 'data-cost="0.167000"' in page and 'data-currency="Buzz"' in page


def test_the_api_and_the_mcp_tool_show_the_same_estimate(mixed, owner):
    _, raw = tokens.token_create(user=owner, name="test")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    view = api.get(f"/api/projects/{mixed.id}").json()
    assert view["cost"]["totals"] == {"USD": "0.50"} and view["cost"]["unknown"] == 2
    one = str(mixed.jobs.filter(provider__isnull=True).first().id)
    chosen = api.post(
        f"/api/projects/{mixed.id}/estimate", data=json.dumps({"job_ids": [one]}), content_type="application/json"
    ).json()
    assert chosen["jobs"] == 1 and chosen["totals"] == {"USD": "0.17"}
    [tool] = [tool for tool in mcp_tools.TOOLS if tool.name == "estimate_start"]
    ctx = mcp_tools.Context(user=owner, base_url="http://testserver")
    assert mcp_tools.call(tool, ctx, {"project_id": mixed.id, "all_drafts": True})["totals"] == view["cost"]["totals"]
    assert mcp_tools.call(tool, ctx, {"project_id": mixed.id, "job_ids": [one]})["totals"] == {"USD": "0.17"}
