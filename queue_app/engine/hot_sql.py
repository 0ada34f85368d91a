"""Written-out statements of the hot path: the few small statements every job runs between
one provider call's end and the next call's start in its slot.

Django takes 1-2 ms to build each statement on this machine class, more than the database
takes to answer these; written out they cost a fraction of a millisecond (the output
writer's quota read went from 2.2 to 0.5 ms). Everything else goes through the ORM: only a
statement measured on the hot path (bench/throughput.py, slot turnover) earns a place here.
Plain parameters only, so one text serves PostgreSQL and SQLite.

Reads with their own SQL live here (the provider lock, the slots in use, the claim's
candidates, the completing job with the quota); plain statements from a model's own
fields are engine/model_sql.py's.
"""

from functools import cache

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from queue_app.engine import fair_share, model_sql
from queue_app.models import AccountSettings, AlbumItem, Job, JobAttempt, Project, Provider, Reference, Status


def _param(model, field: str, value):
    return model._meta.get_field(field).get_db_prep_value(value, connection)


@cache
def now_sql(vendor: str) -> tuple[str, tuple]:
    """Django's Now() as this database's SQL (the database's clock, as the ORM compares)."""
    sql, params = model_sql.compiled(Job, Now())
    return sql, tuple(params)


def lock_provider(provider_id: int, *, shared: bool = False) -> Provider | None:
    """The provider row, locked until commit, or None when it is paused or cooling down
    (nothing is claimed then, nothing locked). PostgreSQL: FOR NO KEY UPDATE, which does
    not block inserts of jobs that reference it; `shared`: FOR SHARE, which handovers take
    together and a claim or an edit of the provider waits for. SQLite's IMMEDIATE
    transaction already holds the one write lock. A shared read also carries `busy_slots`
    (its processing jobs, as this transaction sees them: a handover needs only the count);
    after a wait for the lock it may predate jobs that left, each of which refilled its
    own slot, and a dispatch after commit fills any room left."""
    now, now_params = now_sql(connection.vendor)
    busy = ""
    if shared:
        busy = (
            f", (SELECT COUNT(*) FROM {Job._meta.db_table} j WHERE j.active_provider_id = "
            f"{Provider._meta.db_table}.id AND j.status = '{Status.PROCESSING.value}') AS busy_slots"
        )
    table, columns, names, converters = model_sql.shape(Provider, connection.vendor)
    sql = (
        f"SELECT {columns}{busy} FROM {table} WHERE {table}.id = %s AND {table}.paused = %s "
        f"AND ({table}.cooldown_until IS NULL OR {table}.cooldown_until <= {now})"
    )
    if connection.vendor == "postgresql":
        sql += " FOR SHARE" if shared else " FOR NO KEY UPDATE"
    found = model_sql.fetch(sql, [provider_id, False, *now_params])
    if not found:
        return None
    provider = Provider.from_db(connection.alias, names, model_sql.converted(found[0][: len(names)], converters))
    if shared:
        provider.busy_slots = found[0][-1]
    return provider


def slots_in_use(provider_id: int) -> set[int]:
    """The slot numbers this provider's processing jobs hold."""
    table = Job._meta.db_table
    sql = f"SELECT slot FROM {table} WHERE active_provider_id = %s AND status = %s"
    return {slot for (slot,) in model_sql.fetch(sql, [provider_id, Status.PROCESSING])}


def project_ids(provider_id: int) -> list[int]:
    """The projects whose default provider this is."""
    return [pk for (pk,) in model_sql.fetch(f"SELECT id FROM {Project._meta.db_table} WHERE provider_id = %s", [provider_id])]


def insert_attempt(attempt):
    """insert(attempt), numbered in the same statement: after the highest number of the
    job's attempts, so a job's numbers run 1, 2, 3 and none is skipped or repeated (only
    the holder of the job's lease opens an attempt)."""
    sql = f"COALESCE((SELECT MAX(number) FROM {JobAttempt._meta.db_table} WHERE job_id = %s), 0) + 1"
    return model_sql.insert(attempt, computed={"number": (sql, [_param(Job, "id", attempt.job_id)])})


def _usage_and_limit_sql(owner: str, job: str | None) -> str:
    # `owner` and `job`: SQL naming the user and the job left out (a placeholder, or a
    # column of the statement around it). Placeholders in order: owner, job, owner, owner.
    album = f"SELECT SUM(size) FROM {AlbumItem._meta.db_table} WHERE owner_id = {owner}"
    if job is not None:
        album += f" AND (job_id IS NULL OR job_id <> {job})"
    references = f"SELECT SUM(size) FROM {Reference._meta.db_table} WHERE owner_id = {owner}"
    limit = f"SELECT storage_limit_bytes FROM {AccountSettings._meta.db_table} WHERE user_id = {owner} ORDER BY id LIMIT 1"
    return f"COALESCE(({album}), 0) + COALESCE(({references}), 0), ({limit})"


def _usage_and_limit(used, limit) -> tuple[int, int]:
    return int(used or 0), limit if limit is not None else settings.DEFAULT_STORAGE_LIMIT_BYTES


def job_to_complete(fence: dict):
    """The output writer's first read, in one statement: the job under its fence, locked
    until commit (FOR UPDATE on PostgreSQL), with its owner's album usage (but this job's
    items) and storage limit, and whether the job has album items already (a retry of a
    completed job replaces them). (job, used, limit, has_items), or None when the fence
    no longer holds. The reads beside the row are as of the statement's start: a wait
    for the row lock ends with the fence failing if anyone changed the job meanwhile, and
    only the job's lease holder writes its items."""
    table, columns, names, converters = model_sql.shape(Job, connection.vendor)
    quota = _usage_and_limit_sql(f"{table}.owner_id", f"{table}.id")
    has_items = f"EXISTS (SELECT 1 FROM {AlbumItem._meta.db_table} WHERE job_id = {table}.id)"
    condition, params = model_sql.where_sql(Job, fence)
    sql = f"SELECT {columns}, {quota}, {has_items} FROM {table} WHERE {condition}"
    if connection.vendor == "postgresql":
        sql += " FOR UPDATE"
    rows = model_sql.fetch(sql, params)
    if not rows:
        return None
    row, split = rows[0], len(names)
    job = Job.from_db(connection.alias, names, model_sql.converted(row[:split], converters))
    used, limit = _usage_and_limit(*row[split : split + 2])
    return job, used, limit, bool(row[split + 2])


@cache
def _candidates_shape(vendor: str) -> tuple[str, list, list, list, list]:
    job_fields, project_fields = Job._meta.concrete_fields, Project._meta.concrete_fields
    quote = connection.ops.quote_name  # a column may be a keyword ("references")
    columns = ", ".join([f"j.{quote(f.column)}" for f in job_fields] + [f"p.{quote(f.column)}" for f in project_fields])
    return (
        columns,
        [f.attname for f in job_fields],
        [f.attname for f in project_fields],
        model_sql.converters_of(Job, "j"),
        model_sql.converters_of(Project, "p"),
    )


# Handovers claim side by side, one job each, as many at once as the provider's limit: the
# head of each queue is read that far past `limit` (at most this), so the rows the others
# hold (SKIP LOCKED) leave enough.
HEAD_MARGIN_MAX = 256
# Past this many queues on one provider (SQLite), one unbounded read beats one arm each.
HEAD_MAX_PROJECTS = 50


def dispatchable_with_projects(
    provider_id: int,
    *,
    projects: list[int] | None,
    excluded_kinds: list[str],
    limit: int,
    skip_locked: bool,
    margin: int = 16,
) -> list[Job]:
    """The pending jobs this provider would run now (its own, and its projects' that name no
    provider; due; not a runner's kind), at most `limit`, in fair-share order
    (engine/fair_share.py: each project's oldest first), each with its project in hand
    and `contenders` set (how many projects had work in the heads read); with
    `skip_locked`, rows another transaction holds are passed over (PostgreSQL). Written
    out: built by Django, it took longer than the rest of the claim.

    The heads of each queue that feeds the provider (partial indexes of pending jobs, per
    project) are read, so the cost follows `limit` and the projects, not the backlog
    (bench/claim_backlog.py); when the heads leave fewer than `limit`, every pending job is
    read. `margin`: how many others may claim from the same heads at once. `projects`: the
    provider's projects, or None to have them read here (on PostgreSQL, by the statement
    itself)."""
    direct = None
    if connection.vendor != "postgresql":
        projects = project_ids(provider_id) if projects is None else projects
        direct = fair_share.direct_projects(provider_id)
    jobs = []
    if projects is None or len(projects) + len(direct or ()) <= HEAD_MAX_PROJECTS:
        head = limit + min(margin, HEAD_MARGIN_MAX)
        jobs = _candidates(provider_id, projects, direct, excluded_kinds, limit, skip_locked, head=head)
    if len(jobs) < limit:
        if projects is None:
            projects = project_ids(provider_id)
        jobs = _candidates(provider_id, projects, [], excluded_kinds, limit, skip_locked, head=None)
    return jobs


def _candidates(provider_id, projects, direct, excluded_kinds, limit, skip_locked, *, head: int | None) -> list[Job]:
    columns, job_names, project_names, job_converters, project_converters = _candidates_shape(connection.vendor)
    now, now_params = now_sql(connection.vendor)
    due = f"(not_before IS NULL OR not_before <= {now})"
    heads, heads_params = fair_share.heads_sql(provider_id, projects, direct, due, now_params, head)
    sql, params = fair_share.candidates_sql(
        provider_id,
        heads=heads,
        heads_params=heads_params,
        columns=columns,
        recursive=head is not None and direct is None,
        kinds=list(excluded_kinds),
        pick=head,
    )
    sql += " LIMIT %s"
    params.append(limit)
    if skip_locked and connection.vendor == "postgresql":
        sql += " FOR UPDATE OF j SKIP LOCKED"
    split, end = len(job_names), len(job_names) + len(project_names)
    jobs = []
    # Not prepared: its plan rests on the heads' sizes and the limit, and a plan made once
    # for any values walked the pending jobs (a recovery's claims at 100,000 pending took
    # 4.9 s instead of 0.8 s).
    for row in model_sql.fetch(sql, params, prepared=False):
        job = Job.from_db(connection.alias, job_names, model_sql.converted(row[:split], job_converters))
        job.project = Project.from_db(connection.alias, project_names, model_sql.converted(row[split:end], project_converters))
        job.contenders = row[end]
        jobs.append(job)
    return jobs


def claim_into_slots(rows, *, owner: str, started_at, expiry) -> set:
    """The claim's compare-and-set for many jobs in one UPDATE … FROM (VALUES …) …
    RETURNING: each row (id, provider, slot, lease token, snapshot) moves only if its job
    is still pending and due; status, provider and slot change together, as the slot
    constraint asks. `expiry`: the lease's end, an expression of the database's clock.
    Returns the ids that moved. (Django's CASE/WHEN form took longer to build than the
    database took to claim.)"""
    table = Job._meta.db_table
    fields = [Job._meta.get_field(name) for name in ("id", "active_provider", "slot", "lease_token", "resolved")]
    casts = ("::uuid", "::bigint", "::integer", "::uuid", "::jsonb") if connection.vendor == "postgresql" else ("",) * 5
    row = "(" + ", ".join(f"%s{cast}" for cast in casts) + ")"
    params = [field.get_db_prep_value(value, connection) for values in rows for field, value in zip(fields, values, strict=True)]
    expiry_sql, expiry_params = model_sql.compiled(Job, expiry)
    now, now_params = now_sql(connection.vendor)
    started_at = _param(Job, "started_at", started_at)
    with model_sql.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET status = %s, active_provider_id = v.column2, slot = v.column3, "
            f"lease_token = v.column4, resolved = v.column5, lease_owner = %s, lease_expires_at = {expiry_sql}, "
            "attempts = attempts + 1, started_at = %s, not_before = NULL, run_next_at = NULL, progress = NULL, "
            "poll_failures = 0, next_poll_at = NULL, poll_claimed_until = NULL "
            f"FROM (VALUES {', '.join([row] * len(rows))}) AS v WHERE {table}.id = v.column1 AND {table}.status = %s "
            f"AND ({table}.not_before IS NULL OR {table}.not_before <= {now}) RETURNING {table}.id",
            [Status.PROCESSING, owner, *expiry_params, started_at, *params, Status.PENDING, *now_params],
        )
        return {Job._meta.pk.to_python(job_id) for (job_id,) in cursor.fetchall()}


def as_claimed(job: Job, slot: int, snap: dict, *, provider, token, started_at, owner: str = "") -> Job:
    """The pending `job` in hand as claim_into_slots left its row (for a caller that goes
    on with it in the claim's transaction), but for its lease's expiry, which is the
    database's clock and nobody in that transaction reads."""
    job.status, job.active_provider, job.slot, job.lease_token, job.resolved = Status.PROCESSING, provider, slot, token, snap
    job.lease_owner, job.attempts, job.started_at, job.not_before, job.progress = owner, job.attempts + 1, started_at, None, None
    job.run_next_at = None
    job.poll_failures, job.next_poll_at, job.poll_claimed_until = 0, None, None
    return job
