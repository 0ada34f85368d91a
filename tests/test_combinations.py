"""The combinations generator (issue 29): a workflow's prompt parts, references and option
values crossed in a documented order, wildcards, cycling past the combinations, a seeded
random batch, the prompt-length check per model, and clear refusals of bad input."""

import pytest

from queue_app.models import Job, Status
from queue_app.services.combinations import drafts_generate, workflow_save
from queue_app.services.errors import ServiceError
from queue_app.services.wildcards import parse, wildcard_list_save
from tests.conftest import make_project

pytestmark = pytest.mark.django_db


def item(kind, value, enabled=True):
    return {"type": kind, "value": value, "enabled": enabled}


EIGHT = [
    item("prompt", "a fox"),
    item("prompt", "an owl"),
    item("reference", "https://example.com/a.png"),
    item("reference", "https://example.com/b.png"),
    item("aspect_ratio", "1:1"),
    item("aspect_ratio", "16:9"),
    item("quality", "high", enabled=False),
]


def test_two_prompts_two_references_two_ratios_make_eight_and_ten_drafts_repeat_the_first_two(owner):
    project = make_project(owner)
    preview = drafts_generate(user=owner, project=project, items=EIGHT, quantity=10)
    assert (preview["combinations"], preview["drafts"], preview["repeats"]) == (8, 10, 2)
    assert Job.objects.count() == 0  # a preview creates nothing
    result = drafts_generate(user=owner, project=project, items=EIGHT, quantity=10, create=True)
    jobs = [Job.objects.get(id=job_id) for job_id in result["job_ids"]]
    made = [(job.prompt, job.references[0][-5:], job.aspect_ratio) for job in jobs]
    assert made == [
        ("a fox", "a.png", "1:1"),
        ("a fox", "a.png", "16:9"),
        ("a fox", "b.png", "1:1"),
        ("a fox", "b.png", "16:9"),
        ("an owl", "a.png", "1:1"),
        ("an owl", "a.png", "16:9"),
        ("an owl", "b.png", "1:1"),
        ("an owl", "b.png", "16:9"),
        ("a fox", "a.png", "1:1"),
        ("a fox", "a.png", "16:9"),
    ]
    assert {job.status for job in jobs} == {Status.DRAFT} and {job.quality for job in jobs} == {""}


def test_wildcards_and_named_lists_expand_in_order(owner):
    wildcard_list_save(user=owner, name="animals", values="fox\nowl\n")
    project = make_project(owner)
    items = [item("prompt", "a {red|blue} __animals__"), item("seed", 7)]
    result = drafts_generate(user=owner, project=project, items=items, create=True)
    assert [p["prompt"] for p in result["previews"]] == ["a red fox", "a red owl", "a blue fox", "a blue owl"]
    assert {tuple(job.params.items()) for job in Job.objects.all()} == {(("seed", 7),)}


def test_a_random_batch_repeats_with_its_seed(owner):
    project = make_project(owner)
    items = [item("prompt", "{a|b|c|d|e|f} {1|2|3|4|5|6}")]
    first = drafts_generate(user=owner, project=project, items=items, quantity=12, mode="random", seed=42)
    again = drafts_generate(user=owner, project=project, items=items, quantity=12, mode="random", seed=42)
    other = drafts_generate(user=owner, project=project, items=items, quantity=12, mode="random", seed=43)
    assert first["previews"] == again["previews"] != other["previews"]
    unseeded = drafts_generate(user=owner, project=project, items=items, quantity=3, mode="random")
    assert unseeded["seed"] is not None  # told, so the batch can be made again


def test_the_stored_workflow_is_used_when_none_is_given(owner):
    project = make_project(owner)
    workflow_save(user=owner, project=project, items=EIGHT)
    assert drafts_generate(user=owner, project=project)["combinations"] == 8


def test_a_prompt_longer_than_its_model_takes_cancels_or_is_truncated(owner):
    project = make_project(owner, model="dall-e-2")
    items = [item("prompt", "x" * 1500), item("prompt", "short")]
    with pytest.raises(ServiceError, match="1 combination.*1,500 characters, the limit is 1,000"):
        drafts_generate(user=owner, project=project, items=items, create=True)
    assert Job.objects.count() == 0
    result = drafts_generate(user=owner, project=project, items=items, on_too_long="truncate", create=True)
    assert result["too_long"] == 1
    assert sorted(len(job.prompt) for job in Job.objects.all()) == [5, 1000]


@pytest.mark.parametrize(
    "items, message",
    [
        ([], "no enabled prompt"),
        ([item("prompt", "a", enabled=False), item("model", "x")], "no enabled prompt"),
        ([item("prompt", "a {red|green")], "opened at character 3 never closes"),
        ([item("prompt", "a {red|{green}}")], "do not nest"),
        ([item("prompt", "a __nope__")], "no wildcard list named __nope__"),
        ([item("prompt", "{a|b}"), item("prompt", "{0|1|2|3|4|5|6|7|8|9}" * 6)], "1,000,002 combinations"),
        ([item("prompt", "a"), item("seed", 2**40)], "seed must be a whole number"),
        ([item("prompt", "a"), item("colour", "red")], "type must be one of"),
        ("not a list", "must be a list"),
    ],
)
def test_bad_workflows_get_a_clear_error_and_create_nothing(owner, items, message):
    project = make_project(owner)
    with pytest.raises(ServiceError, match=message):
        drafts_generate(user=owner, project=project, items=items, create=True)
    assert Job.objects.count() == 0


def test_a_bad_reference_or_option_refuses_the_whole_batch(owner):
    project = make_project(owner)
    items = [item("prompt", "a"), item("reference", "ftp://example.com/x.png")]
    with pytest.raises(ServiceError):
        drafts_generate(user=owner, project=project, items=items, create=True)
    with pytest.raises(ServiceError, match="quantity must be a whole number from 1 to 10000"):
        drafts_generate(user=owner, project=project, items=[item("prompt", "a")], quantity=10_001)
    assert Job.objects.count() == 0


def test_another_users_project_is_not_found(owner, outsider):
    project = make_project(owner)
    with pytest.raises(ServiceError, match="project not found"):
        drafts_generate(user=outsider, project=project, items=EIGHT)


def test_a_template_computes_its_nth_expansion_without_listing():
    template = parse("{a|b}-{1|2|3}", {})
    assert template.count == 6
    assert [template.nth(n) for n in range(6)] == ["a-1", "a-2", "a-3", "b-1", "b-2", "b-3"]


def test_a_big_batch_tells_the_page_once_a_small_one_per_draft(owner):
    from queue_app.models import ProjectEvent

    project = make_project(owner)
    drafts_generate(user=owner, project=project, items=[item("prompt", "a {b|c}")], quantity=3, create=True)
    assert ProjectEvent.objects.filter(project=project, kind="job.drafted").count() == 3
    drafts_generate(user=owner, project=project, items=[item("prompt", "a {b|c}")], quantity=501, create=True)
    [batch] = ProjectEvent.objects.filter(project=project, kind="jobs.drafted")
    assert batch.payload == {"count": 501} and Job.objects.count() == 504
