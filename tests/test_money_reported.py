"""Settling at what the provider reported (issue 27): each family's recorded response
(../shared/providers/) carries its billing figure into Finished.usage, priced by the
record's prices; where it reports nothing that prices the job, the estimate stands."""

import dataclasses
from decimal import Decimal

import pytest
import responses

from queue_app.models import Charge, Provider
from queue_app.providers import demo, google, openai, replicate, runninghub
from queue_app.providers.prices import price_for, record_currency, reported_cost
from queue_app.services.jobs import jobs_start
from tests.conftest import make_drafts, make_project, make_provider
from tests.fakes.dns import use_fake_dns
from tests.fakes.provider_shapes import gemini_image, openai_images, replicate_prediction, resolved, rh_result, rh_task


@pytest.fixture(autouse=True)
def _dns(monkeypatch):
    use_fake_dns(monkeypatch)


def settled_at(family, model, usage, options=None):
    price = price_for(family, model, options)
    return reported_cost(price, usage, record_currency(family, options))


@responses.activate
def test_openai_text_settles_from_its_usage_tokens():
    body = {
        "choices": [{"message": {"content": "a haiku"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 100, "total_tokens": 120},
    }
    responses.add(responses.POST, "https://api.openai.com/v1/chat/completions", json=body)
    finished = openai.submit(resolved("openai", kind="text", model="gpt-4o"))
    assert finished.usage == {"input_tokens": 20, "output_tokens": 100}
    # 20 × $2.50 + 100 × $10 per 1M tokens
    assert settled_at("openai", "gpt-4o", finished.usage) == Decimal("0.00105")


@responses.activate
def test_openai_images_report_tokens_priced_only_by_a_records_token_price():
    responses.add(responses.POST, "https://api.openai.com/v1/images/generations", json=openai_images())
    finished = openai.submit(resolved("openai", model="gpt-image-1", aspect_ratio="1024x1024", quality="high"))
    assert finished.usage == {"input_tokens": 50, "output_tokens": 4160}
    assert settled_at("openai", "gpt-image-1", finished.usage) is None  # priced per image: the estimate stands
    own = {"prices": {"gpt-image-1": "5/40"}}
    assert settled_at("openai", "gpt-image-1", finished.usage, own) == Decimal("0.16665")


@responses.activate
def test_gemini_settles_from_its_usage_metadata():
    url = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    responses.add(responses.POST, url, json=gemini_image({"text": "a haiku"}))
    finished = google.submit(resolved("google", kind="text", model="gemini-2.5-flash"))
    assert finished.usage == {"input_tokens": 12, "output_tokens": 1290}
    # 12 × $0.30 + 1290 × $2.50 per 1M tokens
    assert settled_at("google", "gemini-2.5-flash", finished.usage) == Decimal("0.003229")


@responses.activate
def test_replicate_settles_hardware_time_from_metrics_predict_time():
    pid = "vgcm4plb7tgzlyznry5d5jkgvu"
    prediction = replicate_prediction("succeeded", output="https://replicate.delivery/x/out.png", metrics={"predict_time": 4.5})
    responses.add(responses.GET, f"https://api.replicate.com/v1/predictions/{pid}", json=prediction)
    finished = replicate.check(pid, resolved("replicate", model="me/my-model"))
    assert finished.usage == {"predict_time": 4.5}
    assert settled_at("replicate", "me/my-model", finished.usage, {"prices": {"*": "0.001525/s@10"}}) == Decimal("0.006863")
    # an official model priced per image: the estimate stands
    assert settled_at("replicate", "black-forest-labs/flux-schnell", finished.usage) is None


@responses.activate
def test_runninghub_settles_the_coins_it_reports():
    task = rh_task(status="SUCCESS", results=[rh_result("https://rh-images.example.com/output/abc.jpg", "jpg")])
    task["usage"] = {"thirdPartyConsumeMoney": "0.14", "consumeCoins": "17", "taskCostTime": "0"}
    responses.add(responses.POST, "https://www.runninghub.ai/openapi/v2/query", json=task)
    finished = runninghub.check(task["taskId"], resolved("runninghub", model="rhart-image-n-pro/text-to-image"))
    assert finished.usage == {"charged": "17.0", "currency": "coins"}
    assert settled_at("runninghub", "rhart-image-n-pro/text-to-image", finished.usage) == Decimal("17")
    # a record billed in another currency does not take coins for its money
    assert settled_at("runninghub", "workflow", finished.usage, {"currency": "USD"}) is None


def test_an_odd_report_leaves_the_estimate():
    assert reported_cost(None, {"charged": "lots", "currency": "USD"}, "USD") is None
    assert settled_at("openai", "gpt-4o", {"input_tokens": "x", "output_tokens": 3}) is None


@pytest.mark.django_db(transaction=True)
def test_a_finished_job_is_settled_at_the_reported_figure(owner, inline_tasks, monkeypatch):
    plain = demo.submit
    monkeypatch.setattr(
        demo, "submit", lambda job: dataclasses.replace(plain(job), usage={"charged": "0.031", "currency": "USD"})
    )
    project = make_project(owner, make_provider(owner, prices={"*": "0.04"}))
    [job] = make_drafts(project)
    jobs_start(user=owner, project=project, all_drafts=True)
    inline_tasks.run()
    [line] = Charge.objects.filter(job_id=job.id)
    assert (line.state, line.reserved, line.amount, line.source) == ("settled", Decimal("0.04"), Decimal("0.031"), "provider")
    assert Provider.objects.count() == 1
