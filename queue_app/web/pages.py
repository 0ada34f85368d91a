"""Pages. Thin: parse, call one service or selector, render. Every lookup is scoped to
the signed-in user, so another user's project, provider or job answers 404."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Case, Count, IntegerField, Value, When
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from queue_app.engine import events, heartbeats
from queue_app.models import AlbumItem, ApiToken, Kind, Project, Status
from queue_app.selectors.estimate import start_estimate
from queue_app.selectors.job_list import job_row
from queue_app.selectors.jobs import album_counts
from queue_app.selectors.projects import storage_summary
from queue_app.selectors.queue import runner_health
from queue_app.selectors.visibility import visible_providers
from queue_app.services.drafts import MAX_DRAFTS_PER_REQUEST
from queue_app.services.errors import ServiceError
from queue_app.services.jobs import jobs_retry, jobs_start
from queue_app.web import album_files, drafts, tokens
from queue_app.web.shortcuts import act_on_selected, back_to_project, is_uuid, own, own_to_act

SECTION_LIMIT = 200
ALBUM_LIMIT = 300
LAYER_ROLES = ("layer",)


# --- Project page -----------------------------------------------------------------------


def album_groups(project: Project) -> tuple[list[dict], int]:
    """Completed outputs, newest first, grouped under their job (layers under it)."""
    items = list(AlbumItem.objects.filter(project=project).order_by("-created_at", "job_id", "output_index")[:ALBUM_LIMIT])
    total = AlbumItem.objects.filter(project=project).count()
    groups: dict = {}
    for item in items:
        key = item.job_id or f"item-{item.id}"
        group = groups.setdefault(key, {"job_id": item.job_id, "prompt": item.prompt, "main": [], "layers": []})
        (group["layers"] if item.role in LAYER_ROLES else group["main"]).append(item)
    return list(groups.values()), total


def project_context(request, project: Project) -> dict:
    # First: the socket replays events after this seq, so one committed while the
    # sections are read is replayed rather than lost between the reads.
    last_seq = events.last_seq(project.id)
    now = timezone.now()
    providers = visible_providers(request.user)
    live = heartbeats.liveness(now=now)
    counts = dict(project.jobs.values_list("status").annotate(n=Count("id")).order_by())
    order = Case(
        When(status=Status.PROCESSING, then=Value(0)),
        When(status=Status.PENDING, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    queue_jobs = (
        project.jobs.filter(status__in=(Status.PENDING, Status.PROCESSING, Status.FAILED))
        .select_related("project")
        .annotate(order=order)
        .order_by("order", "queued_at", "created_at", "id")[:SECTION_LIMIT]
    )
    health = runner_health([project.id]) if project.kind == Kind.COMFYUI else {}
    queue = [job_row(job, providers=providers, live=live, now=now, health=health) for job in queue_jobs]
    groups, album_total = album_groups(project)
    storage = storage_summary(project.owner, project=project)
    return {
        "storage": storage,
        "cost": start_estimate(project),
        # the quantity field offers no more than a start could take now (drafts cost nothing,
        # but a batch that can never start is a trap)
        "quantity_max": max(1, min(MAX_DRAFTS_PER_REQUEST, storage["fits_now"])),
        "project": project,
        "counts": counts,
        **drafts.drafts_context(request, project),
        "drafts_total": counts.get(Status.DRAFT, 0),
        "queue": queue,
        "queue_total": sum(counts.get(s, 0) for s in (Status.PENDING, Status.PROCESSING, Status.FAILED)),
        "failed_total": counts.get(Status.FAILED, 0),
        "album": groups,
        "album_total": album_total,
        "album_counts": album_counts(project),
        "last_seq": last_seq,
        "section_limit": SECTION_LIMIT,
        "comfy": project.kind == Kind.COMFYUI,
        "instance_health": health.get(project.id),
    }


@login_required
def project_detail(request, project_id):
    project = own(Project, request.user, id=project_id)
    context = project_context(request, project)
    if request.GET.get("fragment"):
        return render(request, "queue_app/project_sections.html", context)
    return render(request, "queue_app/project_detail.html", context)


@login_required
@require_POST
def project_start(request, project_id):
    """Start selected drafts (or failed jobs: retry) — or all drafts."""
    project = own_to_act(Project, request.user, id=project_id)
    ids = [i for i in request.POST.getlist("job") if is_uuid(i)]
    try:
        if request.POST.get("all") == "1":
            result = jobs_start(user=project.owner, project=project, all_drafts=True)
        elif ids:
            result = jobs_start(user=project.owner, project=project, job_ids=ids)
        else:
            raise ServiceError("select jobs first")
        messages.success(request, f"{len(result['started'])} job(s) started")
    except ServiceError as error:
        messages.error(request, error.message)
    return back_to_project(project, request)


@login_required
@require_POST
def project_retry(request, project_id):
    project = own_to_act(Project, request.user, id=project_id)

    def retry(ids) -> int:
        ids = list(project.jobs.filter(id__in=ids).values_list("id", flat=True))
        return len(jobs_retry(user=project.owner, job_ids=ids)["retried"])

    ids = [i for i in request.POST.getlist("job") if is_uuid(i)]
    return act_on_selected(request, project, ids, act=retry, none="select failed jobs first", done="{} job(s) retried")


# --- Album files --------------------------------------------------------------------------


@login_required
def album_file(request, item_id, variant="file"):
    """An album item's file, for its owner only (album files are never public URLs)."""
    item = own(AlbumItem, request.user, id=item_id)
    if item.kind == AlbumItem.ItemKind.TEXT:
        return album_files.harden(HttpResponse(item.text), "text/plain")
    field = item.poster if variant == "poster" else item.file
    if not field:
        raise Http404("no file")
    content_type = item.content_type if variant == "file" else "image/jpeg"
    return album_files.harden(FileResponse(field.open("rb")), content_type, filename=f"album-{item.id}")


# --- Account ----------------------------------------------------------------------------


def account_context(request, **extra) -> dict:
    return {
        "tokens": ApiToken.objects.filter(owner=request.user),
        "new_token": None,
        "storage": storage_summary(request.user),
        **extra,
    }


NEW_TOKEN_KEY = "new_api_token"


@login_required
def account(request):
    # A token just created is shown once: taken out of the session on the first GET, so a
    # refresh neither shows it again nor (being a GET) creates another one.
    new = request.session.pop(NEW_TOKEN_KEY, None)
    extra = {"new_token": new["token"], "new_token_name": new["name"]} if new else {}
    return render(request, "queue_app/account.html", account_context(request, **extra))


@login_required
@require_POST
def account_token_create(request):
    try:
        token, raw = tokens.token_create(user=request.user, name=request.POST.get("name", ""))
    except ServiceError as error:
        messages.error(request, error.message)
        return redirect("account")
    # POST-redirect-GET: the database keeps a hash; the session carries the token to the
    # next page view only.
    request.session[NEW_TOKEN_KEY] = {"token": raw, "name": token.name}
    return redirect("account")


@login_required
@require_POST
def account_token_revoke(request, token_id):
    if tokens.token_revoke(user=request.user, token_id=token_id):
        messages.success(request, "token revoked")
    else:
        messages.error(request, "token not found")
    return redirect("account")
