"""The JSON API: authentication (session + CSRF, API token), the idempotency rules,
the scopes of clear/retry, and 404 for anything foreign."""

import json
import threading
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from queue_app.engine import heartbeats
from queue_app.models import ApiToken, IdempotencyKey, Job, JobAttempt, Provider, Status
from queue_app.services.idempotency import request_fingerprint
from queue_app.web import tokens
from tests.conftest import make_drafts, make_project, make_provider

pytestmark = pytest.mark.django_db


def api_client(user) -> Client:
    _, raw = tokens.token_create(user=user, name="test")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def post(client, path, body=None, **headers):
    return client.post(path, data=json.dumps(body or {}), content_type="application/json", **headers)


@pytest.fixture
def api(owner):
    return api_client(owner)


@pytest.fixture
def failed(owner, provider, project):
    """3 failed jobs in `project` (provider), 2 in another project on another provider."""
    other_provider = make_provider(owner, name="Other")
    other = make_project(owner, other_provider, name="Other")
    mine = make_drafts(project, 3)
    theirs = make_drafts(other, 2)
    Job.objects.filter(id__in=[j.id for j in mine + theirs]).update(status=Status.FAILED, error="boom")
    # with attempt records, as real failures have (a count must not include them)
    JobAttempt.objects.bulk_create([JobAttempt(job=j, number=1, outcome="permanent") for j in mine + theirs])
    return {"other_project": other, "other_provider": other_provider}


# --- authentication ---


def test_status_needs_a_session_or_a_token(client, owner, api):
    assert client.get("/api/queue/status").status_code == 401
    assert Client(HTTP_AUTHORIZATION="Bearer rsq_wrong").get("/api/queue/status").status_code == 401
    assert api.get("/api/queue/status").status_code == 200
    client.force_login(owner)
    assert client.get("/api/queue/status").status_code == 200


def test_tokens_are_stored_hashed_shown_once_and_revocable(client, owner):
    client.force_login(owner)
    response = client.post("/account/tokens", {"name": "laptop"}, follow=True)
    assert response.redirect_chain == [("/account/", 302)]  # a refresh re-sends no POST (issue 12)
    raw = response.context["new_token"]
    assert raw.startswith("rsq_") and raw in response.content.decode()
    token = ApiToken.objects.get(owner=owner)
    assert token.token_hash == tokens.token_hash(raw) and raw not in (token.token_hash, token.prefix)
    assert raw not in client.get("/account/").content.decode()  # never shown again
    assert ApiToken.objects.filter(owner=owner).count() == 1
    with_token = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert with_token.get("/api/queue/status").status_code == 200
    client.post(f"/account/tokens/{token.id}/revoke")
    assert with_token.get("/api/queue/status").status_code == 401


def test_a_session_write_needs_csrf_and_a_token_write_does_not(owner, project):
    make_drafts(project, 1)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    assert post(browser, "/api/queue/clear-failed").status_code == 403
    token_client = api_client(owner)
    token_client.handler.enforce_csrf_checks = True
    assert post(token_client, "/api/queue/clear-failed").status_code == 200


# --- queue status ---


def test_status_returns_the_selector_counts_with_breakdowns(api, owner, failed, project):
    heartbeats.beat("worker")
    body = api.get("/api/queue/status?breakdown=all").json()
    assert body["totals"]["failed"] == 5 and body["totals"]["providers"] == 2
    assert {p["name"] for p in body["providers"]} == {"Demo", "Other"}
    assert {p["id"] for p in body["projects"]} == {project.id, failed["other_project"].id}
    limited = api.get("/api/queue/status?breakdown=projects&limit=1").json()
    assert len(limited["projects"]) == 1 and limited["projects_total"] == 2 and limited["projects_has_more"]
    assert "providers" not in api.get("/api/queue/status").json()
    assert api.get("/api/queue/status?breakdown=bogus").status_code == 400
    assert api.get("/api/queue/status?limit=0").status_code == 400


# --- clear / retry failed ---


def test_clear_failed_scopes(api, owner, project, provider, failed):
    dry = post(api, "/api/queue/clear-failed", {"scope": "project", "project_id": project.id, "dry_run": True}).json()
    assert dry["affected"] == 3 and Job.objects.filter(status=Status.FAILED).count() == 5
    assert post(api, "/api/queue/clear-failed", {"project_id": project.id}).json()["cleared"] == 3
    assert Job.objects.filter(status=Status.FAILED).count() == 2
    body = post(api, "/api/queue/clear-failed", {"scope": "provider", "provider_id": failed["other_provider"].id}).json()
    assert body["cleared"] == 2 and not Job.objects.filter(status=Status.FAILED).exists()


def test_clear_failed_all_and_mutually_exclusive_scopes(api, owner, project, provider, failed):
    both = post(api, "/api/queue/clear-failed", {"project_id": project.id, "provider_id": provider.id})
    assert both.status_code == 400 and "mutually exclusive" in both.json()["error"]
    assert post(api, "/api/queue/clear-failed", {"scope": "project"}).status_code == 400
    assert post(api, "/api/queue/clear-failed", {"scope": "all", "project_id": project.id}).status_code == 400
    assert post(api, "/api/queue/clear-failed", {"scope": "everything"}).status_code == 400
    assert Job.objects.filter(status=Status.FAILED).count() == 5
    assert post(api, "/api/queue/clear-failed", {"scope": "all"}).json()["cleared"] == 5


def test_clear_all_never_touches_another_users_jobs(api, outsider, failed):
    theirs = make_drafts(make_project(outsider, make_provider(outsider)), 2)
    Job.objects.filter(id__in=[j.id for j in theirs]).update(status=Status.FAILED)
    assert post(api, "/api/queue/clear-failed").json()["cleared"] == 5
    assert Job.objects.filter(owner=outsider, status=Status.FAILED).count() == 2


def test_retry_failed_in_a_project(api, project, failed, inline_tasks):
    assert post(api, "/api/queue/retry-failed", {"project_id": project.id}).json()["retried"] == 3
    assert Job.objects.filter(status=Status.FAILED).count() == 2


def test_retry_selected_jobs(api, owner, project, inline_tasks):
    jobs = make_drafts(project, 3)
    Job.objects.filter(id__in=[j.id for j in jobs[:2]]).update(status=Status.FAILED)
    body = post(api, "/api/jobs/retry", {"job_ids": [str(j.id) for j in jobs]}).json()
    assert sorted(body["retried"]) == sorted(str(j.id) for j in jobs[:2]) and body["skipped"] == 1
    assert post(api, "/api/jobs/retry", {"job_ids": ["not-a-uuid"]}).status_code == 400


# --- drafts, start, list ---


@pytest.mark.django_db(transaction=True)
def test_create_drafts_start_them_and_list_the_jobs(api, owner, project, inline_tasks):
    response = post(api, f"/api/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": 3, "aspect_ratio": "16:9"})
    assert response.status_code == 201
    ids = [j["id"] for j in response.json()["jobs"]]
    assert Job.objects.filter(id__in=ids, status=Status.DRAFT, aspect_ratio="16:9").count() == 3
    started = post(api, f"/api/projects/{project.id}/start", {"job_ids": ids[:1]}).json()
    assert started["started"] == ids[:1]
    started = post(api, f"/api/projects/{project.id}/start", {"all_drafts": True}).json()
    assert sorted(started["started"]) == sorted(ids[1:])
    listing = api.get(f"/api/projects/{project.id}/jobs?per_page=2").json()
    assert listing["total"] == 3 and len(listing["jobs"]) == 2 and listing["pages"] == 2
    assert {j["state"] for j in listing["jobs"]} <= {"running", "queued", "waiting"}
    inline_tasks.run()
    done = api.get(f"/api/projects/{project.id}/jobs?status=completed&attempts=1").json()
    assert done["total"] == 3 and done["jobs"][0]["attempt_log"][0]["outcome"] == "completed"
    assert api.get(f"/api/projects/{project.id}/jobs?status=nope").status_code == 400


def test_create_drafts_refuses_bad_input_with_a_readable_error(api, project):
    for body in ({"prompt": ""}, {"prompt": "x", "quantity": 0}, {"prompt": "x", "quantity": "3"}, {"prompt": "x", "bogus": 1}):
        response = post(api, f"/api/projects/{project.id}/drafts", body)
        assert response.status_code == 400 and response.json()["error"]
    response = api.post(f"/api/projects/{project.id}/drafts", data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_provider_pause_resume_and_concurrency(api, provider):
    assert post(api, f"/api/providers/{provider.id}", {"paused": True}).json()["paused"] is True
    assert Provider.objects.get(id=provider.id).paused
    body = post(api, f"/api/providers/{provider.id}", {"paused": False, "concurrency": 5}).json()
    assert body == {**body, "paused": False, "concurrency": 5}
    assert post(api, f"/api/providers/{provider.id}", {"concurrency": 0}).status_code == 400
    assert post(api, f"/api/providers/{provider.id}", {}).status_code == 400
    assert api.get(f"/api/providers/{provider.id}").json()["concurrency"] == 5  # GET reads it (issue 12)
    assert api.put(f"/api/providers/{provider.id}").status_code == 405


# --- foreign ids ---


def test_a_foreign_project_or_provider_answers_404_everywhere(owner, outsider, project, provider, client):
    [job] = make_drafts(project, 1)
    Job.objects.filter(id=job.id).update(status=Status.FAILED)
    intruder = api_client(outsider)
    pid = project.id
    assert intruder.get(f"/api/projects/{pid}/jobs").status_code == 404
    assert post(intruder, f"/api/projects/{pid}/drafts", {"prompt": "x"}).status_code == 404
    assert post(intruder, f"/api/projects/{pid}/start", {"all_drafts": True}).status_code == 404
    assert post(intruder, "/api/queue/clear-failed", {"project_id": pid}).status_code == 404
    assert post(intruder, "/api/queue/retry-failed", {"project_id": pid}).status_code == 404
    assert post(intruder, "/api/queue/clear-failed", {"provider_id": provider.id}).status_code == 404
    assert post(intruder, f"/api/providers/{provider.id}", {"paused": True}).status_code == 404
    assert post(intruder, "/api/jobs/retry", {"job_ids": [str(job.id)]}).status_code == 404
    client.force_login(outsider)
    for path in (f"/projects/{pid}/", f"/jobs/{job.id}/"):
        assert client.get(path).status_code == 404
    for path in (f"/projects/{pid}/start", f"/projects/{pid}/drafts", f"/projects/{pid}/retry"):
        assert client.post(path, {"prompt": "x", "all": "1"}).status_code == 404
    assert Job.objects.get(id=job.id).status == Status.FAILED and Job.objects.count() == 1
    assert not Provider.objects.get(id=provider.id).paused


# --- idempotency ---


def test_idempotency_replays_the_first_response_for_the_same_body(api, project):
    path, body = f"/api/projects/{project.id}/drafts", {"prompt": "a fox", "quantity": 2}
    first = post(api, path, body, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(api, path, body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert Job.objects.count() == 2


def test_idempotency_refuses_a_different_body_with_422(api, project):
    path = f"/api/projects/{project.id}/drafts"
    post(api, path, {"prompt": "a fox"}, HTTP_IDEMPOTENCY_KEY="k-2")
    response = post(api, path, {"prompt": "a cat"}, HTTP_IDEMPOTENCY_KEY="k-2")
    assert response.status_code == 422 and Job.objects.count() == 1
    # the same key on another endpoint is a different request too
    assert post(api, f"/api/projects/{project.id}/start", {"all_drafts": True}, HTTP_IDEMPOTENCY_KEY="k-2").status_code == 422


def test_an_idempotent_start_replays_the_first_result_and_refuses_a_different_request(api, project):
    jobs = make_drafts(project, 2)
    Provider.objects.filter(id=project.provider_id).update(paused=True)  # nothing runs: the answer alone counts
    path = f"/api/projects/{project.id}/start"
    first = post(api, path, {"job_ids": [str(jobs[0].id)]}, HTTP_IDEMPOTENCY_KEY="start-1")
    again = post(api, path, {"job_ids": [str(jobs[0].id)]}, HTTP_IDEMPOTENCY_KEY="start-1")
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() and first.json()["started"] == [str(jobs[0].id)]
    other = post(api, path, {"job_ids": [str(jobs[1].id)]}, HTTP_IDEMPOTENCY_KEY="start-1")
    assert other.status_code == 422
    assert Job.objects.get(id=jobs[1].id).status == Status.DRAFT


def test_idempotency_answers_409_while_the_first_request_runs(api, owner, project):
    body = {"prompt": "a fox"}
    IdempotencyKey.objects.create(
        owner=owner,
        key="k-3",
        scope=f"drafts:{project.id}",
        request_hash=request_fingerprint(f"drafts:{project.id}", body),
    )
    response = post(api, f"/api/projects/{project.id}/drafts", body, HTTP_IDEMPOTENCY_KEY="k-3")
    assert response.status_code == 409 and not Job.objects.exists()


def test_idempotency_keys_are_per_user(api, outsider, project):
    theirs = make_project(outsider, make_provider(outsider))
    body = {"prompt": "a fox"}
    assert post(api, f"/api/projects/{project.id}/drafts", body, HTTP_IDEMPOTENCY_KEY="same").status_code == 201
    other = api_client(outsider)
    assert post(other, f"/api/projects/{theirs.id}/drafts", body, HTTP_IDEMPOTENCY_KEY="same").status_code == 201
    assert Job.objects.count() == 2


def test_idempotency_keys_are_kept_a_day(api, project):
    path, body = f"/api/projects/{project.id}/drafts", {"prompt": "a fox"}
    post(api, path, body, HTTP_IDEMPOTENCY_KEY="aging")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=23))
    assert post(api, path, body, HTTP_IDEMPOTENCY_KEY="aging").status_code == 201 and Job.objects.count() == 1
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    assert post(api, path, body, HTTP_IDEMPOTENCY_KEY="aging").status_code == 201 and Job.objects.count() == 2


def test_a_refused_request_does_not_burn_its_key(api, project):
    path = f"/api/projects/{project.id}/drafts"
    assert post(api, path, {"prompt": ""}, HTTP_IDEMPOTENCY_KEY="retryable").status_code == 400
    assert not IdempotencyKey.objects.exists()


def test_start_is_idempotent(api, project, inline_tasks):
    make_drafts(project, 2)
    path = f"/api/projects/{project.id}/start"
    first = post(api, path, {"all_drafts": True}, HTTP_IDEMPOTENCY_KEY="s-1")
    make_drafts(project, 1)
    again = post(api, path, {"all_drafts": True}, HTTP_IDEMPOTENCY_KEY="s-1")
    assert first.json() == again.json() and len(first.json()["started"]) == 2
    assert Job.objects.filter(status=Status.DRAFT).count() == 1  # the replay started nothing new


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_identical_requests_with_one_key_create_one_set_of_jobs(owner, project):
    _, raw = tokens.token_create(user=owner, name="burst")
    path, body = f"/api/projects/{project.id}/drafts", {"prompt": "burst", "quantity": 3}
    codes, barrier = [], threading.Barrier(50)

    def call():
        from django.db import connection

        client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        barrier.wait()
        try:
            codes.append(post(client, path, body, HTTP_IDEMPOTENCY_KEY="burst-key").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=call) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(codes) == 50 and set(codes) <= {201, 409} and 201 in codes
    assert Job.objects.filter(project=project).count() == 3
