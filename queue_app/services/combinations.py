"""The combinations generator: a project's workflow crossed into drafts.

A workflow is an ordered list of items, each {"type", "value", "enabled"}: prompt parts,
reference images, provider records to fan out to (`"<id>"` or `"<id>:<model>"`) and option
values (model, aspect ratio, quality, resolution, duration, seed). Enabled items of one
type are alternatives; the types are crossed, in the order each type first appears, the
last turning fastest. A prompt's wildcards (services/wildcards.py) add alternatives to the
prompt dimension. Asked for more drafts than combinations, "ordered" cycles through them
again; "random" picks a combination per draft from a seeded generator, so a seed repeats
its batch.

One service for the project page, the JSON API and MCP: `drafts_generate` previews
(counts, the first drafts) and, when asked, creates them in bulk.
"""

import bisect
import random
from dataclasses import dataclass

from django.db import transaction

from queue_app import limits
from queue_app.engine import events
from queue_app.models import Job, Project, ProjectWorkflow, Provider, Status
from queue_app.providers.prompt_limits import prompt_limit
from queue_app.selectors.batches import wildcard_lists, workflow_items
from queue_app.services import references, wildcards
from queue_app.services.drafts import draft_default_model, draft_provider_check, draft_values
from queue_app.services.errors import ServiceError
from queue_app.services.storage import references_store_new

TEXT_OPTIONS = ("model", "aspect_ratio", "quality", "resolution")
ITEM_TYPES = ("prompt", "reference", "provider", *TEXT_OPTIONS, "duration", "seed")
MODES = ("ordered", "random")
ON_TOO_LONG = ("cancel", "truncate")
PREVIEWS = 20


@dataclass
class Dimension:
    type: str
    values: list  # prompt: wildcards.Template; others: plain values
    offsets: list  # prompt: where each template's expansions start

    @property
    def size(self) -> int:
        return self.offsets[-1] if self.type == "prompt" else len(self.values)

    def pick(self, index: int):
        if self.type != "prompt":
            return self.values[index]
        which = bisect.bisect_right(self.offsets, index) - 1
        return self.values[which].nth(index - self.offsets[which])


@dataclass
class Plan:
    dimensions: list[Dimension]

    @property
    def count(self) -> int:
        total = 1
        for dimension in self.dimensions:
            total *= dimension.size
        return total

    def combination(self, index: int) -> dict:
        """Combination number `index`: {type: value} (the last dimension turns fastest)."""
        chosen = {}
        for dimension in reversed(self.dimensions):
            index, pick = divmod(index, dimension.size)
            chosen[dimension.type] = dimension.pick(pick)
        return chosen


def workflow_checked(items) -> list[dict]:
    """A workflow's items, each {"type", "value", "enabled"}, or a ServiceError naming the
    first bad one."""
    if not isinstance(items, list):
        raise ServiceError("the workflow must be a list of items")
    if len(items) > limits.WORKFLOW_ITEMS:
        raise ServiceError(f"a workflow holds at most {limits.WORKFLOW_ITEMS} items (this one has {len(items)})")
    return [_item_checked(number, item) for number, item in enumerate(items, start=1)]


def _item_checked(number: int, item) -> dict:
    where = f"workflow item {number}"
    if not isinstance(item, dict) or set(item) - {"type", "value", "enabled"}:
        raise ServiceError(f"{where}: an item is an object with type, value and enabled")
    kind, value, enabled = item.get("type"), item.get("value"), item.get("enabled", True)
    if kind not in ITEM_TYPES:
        raise ServiceError(f"{where}: type must be one of {', '.join(ITEM_TYPES)}")
    if not isinstance(enabled, bool):
        raise ServiceError(f"{where}: enabled must be true or false")
    if kind in ("duration", "seed"):
        bound = limits.DURATION if kind == "duration" else limits.SEED
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if not bound.contains(value) or not isinstance(value, int):
            raise ServiceError(f"{where}: {bound.message()}")
    elif kind == "provider":
        value = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
        record, _, model = value.partition(":")
        if not record.isdigit() or len(record) > 18 or len(model) > limits.MODEL_CHARS:
            raise ServiceError(f"{where}: a provider is its record id, or id:model (3:gpt-image-1)")
    else:
        high = limits.PROMPT_CHARS if kind == "prompt" else limits.REFERENCE_CHARS if kind == "reference" else 200
        if not isinstance(value, str) or not value.strip() or len(value) > high or "\x00" in value:
            raise ServiceError(f"{where}: the {kind} must be text of 1 to {high} characters")
        value = value.strip()
    return {"type": kind, "value": value, "enabled": enabled}


def plan_of(items: list[dict], lists: dict[str, list[str]]) -> Plan:
    """The dimensions of a checked workflow's enabled items, or a ServiceError when it
    makes no draft or too many combinations."""
    grouped: dict[str, list] = {}
    for item in items:
        if item["enabled"]:
            grouped.setdefault(item["type"], []).append(item["value"])
    if not grouped.get("prompt"):
        raise ServiceError("the workflow has no enabled prompt part: add one (or enable one)", reason="empty_workflow")
    dimensions = []
    for kind, values in grouped.items():
        values = list(dict.fromkeys(values))  # the same value twice is one alternative
        offsets = []
        if kind == "prompt":
            values = [wildcards.parse(text, lists) for text in values]
            offsets = [0]
            for template in values:
                offsets.append(offsets[-1] + template.count)
                if offsets[-1] > limits.COMBINATIONS:
                    break
        dimensions.append(Dimension(kind, values, offsets))
    plan = Plan(dimensions)
    if plan.count > limits.COMBINATIONS:
        raise ServiceError(
            f"this workflow makes {plan.count:,} combinations; at most {limits.COMBINATIONS:,} "
            "(disable some items or shorten a wildcard list)",
            reason="too_many_combinations",
        )
    return plan


def indices(plan: Plan, quantity: int, mode: str, seed: int | None) -> list[int]:
    """Which combination each draft takes: in order, cycling; or drawn with the seed."""
    count = plan.count
    if mode == "random":
        draw = random.Random(seed)
        return [draw.randrange(count) for _ in range(quantity)]
    return [number % count for number in range(quantity)]


def workflow_save(*, user, project: Project, items) -> list[dict]:
    """Store the project's workflow (checked first)."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    items = workflow_checked(items)
    ProjectWorkflow.objects.update_or_create(project=project, defaults={"items": items})
    return items


def drafts_generate(
    *,
    user,
    project: Project,
    items: list | None = None,
    quantity: int | None = None,
    mode: str = "ordered",
    seed: int | None = None,
    on_too_long: str = "cancel",
    save: bool = False,
    create: bool = False,
) -> dict:
    """Preview — and with `create`, make — the drafts of a workflow (`items`, or the
    project's stored one): counts, the first PREVIEWS drafts and, created, their ids.
    `quantity` defaults to one draft per combination; `on_too_long` says what a prompt
    longer than its model takes does: refuse the batch, or be cut to fit."""
    if project.owner_id != user.id:
        raise ServiceError("project not found", 404, field="project_id")
    if mode not in MODES:
        raise ServiceError(f"mode must be one of {', '.join(MODES)}", field="mode")
    if on_too_long not in ON_TOO_LONG:
        raise ServiceError(f"on_too_long must be one of {', '.join(ON_TOO_LONG)}", field="on_too_long")
    items = workflow_checked(workflow_items(project) if items is None else items)
    plan = plan_of(items, wildcard_lists(user))
    quantity = plan.count if quantity is None else quantity
    if not limits.GENERATED_DRAFTS.contains(quantity) or not isinstance(quantity, int):
        raise ServiceError(limits.GENERATED_DRAFTS.message(), field="quantity")
    if mode == "random" and seed is None:
        seed = random.SystemRandom().randrange(limits.SEED.high + 1)  # returned, so the batch can be made again
    if seed is not None and (not limits.SEED.contains(seed) or not isinstance(seed, int)):
        raise ServiceError(limits.SEED.message(), field="seed")
    picks = indices(plan, quantity, mode, seed if mode == "random" else None)
    combos = {index: plan.combination(index) for index in dict.fromkeys(picks)}
    too_long = fit_prompts(project, combos, picks, on_too_long)
    if save:
        workflow_save(user=user, project=project, items=items)
    result = {
        "combinations": plan.count,
        "drafts": quantity,
        "repeats": max(0, quantity - plan.count) if mode == "ordered" else quantity - len(combos),
        "mode": mode,
        "seed": seed if mode == "random" else None,
        "dimensions": [{"type": d.type, "count": d.size} for d in plan.dimensions],
        "too_long": too_long,
        "previews": [draft_preview(combos[index]) for index in picks[:PREVIEWS]],
        "job_ids": [],
    }
    if create:
        result["job_ids"] = [str(job.id) for job in drafts_create_many(user, project, combos, picks)]
    return result


def fit_prompts(project: Project, combos: dict, picks: list[int], on_too_long: str) -> int:
    """How many drafts' prompts are longer than their model takes; cut to fit
    (`truncate`) or a ServiceError saying which (`cancel`)."""
    long_ones = []
    for index, combo in combos.items():
        if not combo["prompt"]:
            raise ServiceError(f"combination {index + 1} makes an empty prompt (an empty wildcard value?)")
        limit = min(prompt_limit(target_model(combo) or project.model), limits.PROMPT_CHARS)
        if len(combo["prompt"]) > limit:
            long_ones.append((index, limit))
    if long_ones and on_too_long == "cancel":
        index, limit = long_ones[0]
        raise ServiceError(
            f"{len(long_ones)} combination(s) have a prompt longer than their model takes (combination {index + 1}: "
            f"{len(combos[index]['prompt']):,} characters, the limit is {limit:,}); shorten them, or choose truncate",
            reason="prompt_too_long",
        )
    for index, limit in long_ones:
        combos[index]["prompt"] = combos[index]["prompt"][:limit].rstrip()
    chosen = {index for index, _ in long_ones}
    return sum(1 for index in picks if index in chosen)


def target_model(combo: dict) -> str:
    """The model a combination names: its provider target's, else its model option's."""
    return combo.get("provider", "").partition(":")[2] or combo.get("model", "")


def providers_of(user, project: Project, combos: dict) -> dict:
    """Each distinct provider target → (the user's record, the model its drafts run):
    the target's model, else the combination's own, else that family's default."""
    targets = {}
    for value in {combo["provider"] for combo in combos.values() if "provider" in combo}:
        record, _, model = value.partition(":")
        provider = Provider.objects.filter(id=int(record), owner=user).first()
        if provider is None:
            raise ServiceError(f"provider {record} not found", 404, field="provider")
        draft_provider_check(user=user, project=project, provider=provider)
        targets[value] = (provider, model)
    return targets


def draft_preview(combo: dict) -> dict:
    settings_ = {key: value for key, value in combo.items() if key not in ("prompt", "reference")}
    return {"prompt": combo["prompt"], "references": [combo["reference"]] if "reference" in combo else [], "settings": settings_}


def drafts_create_many(user, project: Project, combos: dict, picks: list[int]) -> list[Job]:
    """The drafts, in one transaction and a few statements. Each distinct reference and
    option value is checked once (the same checks as one draft's); new images are stored
    only when all are valid."""
    stored = {}
    for value in {combo["reference"] for combo in combos.values() if "reference" in combo}:
        try:
            stored[value] = references.normalize(user, [value])
        except references.BadReference as error:
            raise ServiceError(str(error)) from None
    for kind in (*TEXT_OPTIONS, "duration"):
        for value in {combo[kind] for combo in combos.values() if kind in combo}:
            draft_values(user=user, settings_={kind: value})
    stored = {value: references_store_new(user, items) for value, items in stored.items()}
    targets = providers_of(user, project, combos)
    rows = {index: job_fields(project, combo, stored, targets) for index, combo in combos.items()}
    jobs = [Job(project=project, owner=user, **rows[index]) for index in picks]
    with transaction.atomic():
        Job.objects.bulk_create(jobs, batch_size=1000)
        if len(jobs) > limits.QUANTITY.high:  # the page reloads on any event: one says it for a big batch
            events.emit_many(project.id, [("jobs.drafted", None, Status.DRAFT, {"count": len(jobs)})])
        else:
            events.emit_many(project.id, [("job.drafted", job.id, Status.DRAFT, {}) for job in jobs])
    return jobs


def job_fields(project: Project, combo: dict, stored: dict, targets: dict) -> dict:
    fields = {"prompt": combo["prompt"], "references": stored.get(combo.get("reference"), [])}
    fields.update({kind: combo[kind] for kind in (*TEXT_OPTIONS, "duration") if kind in combo})
    if "provider" in combo:
        provider, model = targets[combo["provider"]]
        fields["provider"] = provider
        fields["model"] = model or fields.get("model", "")
        draft_default_model(project=project, provider=provider, values=fields)
    if "seed" in combo:
        fields["params"] = {"seed": combo["seed"]}
    return fields
