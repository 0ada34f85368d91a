"""Fair share: who goes next when several projects have pending work on one provider.

A job's place is the share its project would hold once it runs: (slots the project holds
+ its jobs ahead of it in its own queue) / the project's weight, lowest first. A project
holding no slot takes the next free one, whatever the batch in front of it; equal shares
take turns, the project longest unserved on this provider first (`ShareTurn`), then the
oldest job. Within a project the order stays oldest first.

Still one statement: the head of each queue feeding the provider (partial indexes of
pending jobs, per project), numbered within its project, leads the join; the slots held
per project are counted over the provider's processing jobs. docs/fair-share.md.
"""

from django.db import connection

from queue_app.models import Job, Project, ShareTurn, Status

PENDING = f"'{Status.PENDING.value}'"
PROCESSING = f"'{Status.PROCESSING.value}'"
ORDER = "ORDER BY queued_at ASC, created_at ASC, id ASC"
HEAD_COLUMNS = "id, project_id, queued_at, created_at, run_next_at"


def heads_sql(provider_id: int, projects: list[int] | None, direct: list[int] | None, due: str, due_params, head):
    """The rows at the head of each queue feeding the provider, `head` of each (None: every
    pending row), in HEAD_COLUMNS: (SQL, parameters). The jobs moved to the front ("run
    next") are one more queue.

    A provider's own jobs (a draft that names it) are read per project too (`direct`: those
    projects; None: found by the statement, walking the index's project ids). `projects`:
    the projects whose default provider this is, or None to have them read by the
    statement (PostgreSQL's LATERAL)."""
    table = Job._meta.db_table
    if head is None:
        owned = "provider_id = %s"
        params = [provider_id]
        if projects:
            owned = f"({owned} OR (provider_id IS NULL AND project_id IN ({', '.join(['%s'] * len(projects))})))"
            params += projects
        return f"SELECT {HEAD_COLUMNS} FROM {table} WHERE status = {PENDING} AND {owned} AND {due}", [*params, *due_params]
    limit = f"{ORDER} LIMIT %s"
    own = (
        f"SELECT {HEAD_COLUMNS} FROM {table} WHERE status = {PENDING} AND provider_id = %s AND project_id = %s AND {due} {limit}"
    )
    by_default = (
        f"SELECT {HEAD_COLUMNS} FROM {table} WHERE status = {PENDING} AND provider_id IS NULL "
        f"AND project_id = %s AND {due} {limit}"
    )
    arms, params = [], []
    if direct is None:
        arms.append(
            f"SELECT h.* FROM direct_projects dp CROSS JOIN LATERAL ({own.replace('project_id = %s', 'project_id = dp.pid')}) h"
        )
        params += [provider_id, *due_params, head]
    else:
        for n, project_id in enumerate(direct):
            arms.append(f"SELECT * FROM ({own}) d{n}")
            params += [provider_id, project_id, *due_params, head]
    if projects is None:
        lateral = by_default.replace("project_id = %s", "project_id = pr.id")
        arms.append(f"SELECT h.* FROM {Project._meta.db_table} pr CROSS JOIN LATERAL ({lateral}) h WHERE pr.provider_id = %s")
        params += [*due_params, head, provider_id]
    else:
        for n, project_id in enumerate(projects):
            arms.append(f"SELECT * FROM ({by_default}) p{n}")
            params += [project_id, *due_params, head]
    pushed, pushed_params = _run_next_arm(provider_id, projects, due, due_params, head)
    if not arms:
        return pushed, pushed_params
    # UNION, not ALL, after the queues: a job moved to the front may be in its queue's head too.
    return " UNION ALL ".join(arms) + " UNION " + pushed, [*params, *pushed_params]


def _run_next_arm(provider_id: int, projects: list[int] | None, due: str, due_params, head: int):
    """The provider's jobs moved to the front, earliest moved first, from their own small
    partial index."""
    table, owned, params = Job._meta.db_table, "provider_id = %s", [provider_id]
    if projects is None:
        owned += f" OR (provider_id IS NULL AND project_id IN (SELECT id FROM {Project._meta.db_table} WHERE provider_id = %s))"
        params.append(provider_id)
    elif projects:
        owned += f" OR (provider_id IS NULL AND project_id IN ({', '.join(['%s'] * len(projects))}))"
        params += projects
    sql = (
        f"SELECT * FROM (SELECT {HEAD_COLUMNS} FROM {table} WHERE status = {PENDING} AND run_next_at IS NOT NULL "
        f"AND ({owned}) AND {due} ORDER BY run_next_at ASC, id ASC LIMIT %s) rn"
    )
    return sql, [*params, *due_params, head]


def direct_projects_sql(provider_id: int) -> tuple[str, list]:
    """A recursive walk of the projects whose pending jobs name this provider, one index
    probe each (the index leads with provider, then project): (CTE body, parameters)."""
    table = Job._meta.db_table
    first = f"SELECT MIN(project_id) FROM {table} WHERE status = {PENDING} AND provider_id = %s"
    step = (
        f"SELECT (SELECT MIN(project_id) FROM {table} WHERE status = {PENDING} AND provider_id = %s "
        "AND project_id > dp.pid) FROM direct_projects dp WHERE dp.pid IS NOT NULL"
    )
    return f"direct_projects(pid) AS ({first} UNION ALL {step})", [provider_id, provider_id]


def direct_projects(provider_id: int) -> list[int]:
    """The projects whose pending jobs name this provider (SQLite: read before the claim)."""
    from queue_app.engine import model_sql

    body, params = direct_projects_sql(provider_id)
    rows = model_sql.fetch(f"WITH RECURSIVE {body} SELECT pid FROM direct_projects WHERE pid IS NOT NULL", params)
    return [pid for (pid,) in rows]


def candidates_sql(provider_id: int, *, heads: str, heads_params: list, columns: str, recursive: bool, kinds, pick):
    """The claim's read around the heads: (SQL, parameters) up to its ORDER BY's end; the
    caller adds LIMIT and the lock. The heads are ranked on narrow rows (`ranked`, the
    first `pick` in fair order; None: all), and only those are joined to their jobs and
    projects. The last column says how many projects contend."""
    table, projects, turns = Job._meta.db_table, Project._meta.db_table, ShareTurn._meta.db_table
    first = "CASE WHEN h.run_next_at IS NULL THEN 1 ELSE 0 END, h.run_next_at"
    number = f"ROW_NUMBER() OVER (PARTITION BY h.project_id ORDER BY {first}, h.queued_at, h.created_at, h.id) - 1"
    real = "DOUBLE PRECISION" if connection.vendor == "postgresql" else "REAL"
    order = (
        "pushed ASC, heads.run_next_at ASC, share ASC, served ASC, t.served_at ASC, heads.queued_at ASC, "
        "heads.created_at ASC, heads.id ASC"
    )
    excluded = f" AND NOT (pr.kind IN ({', '.join(['%s'] * len(kinds))}))" if kinds else ""
    ctes = [
        "heads AS MATERIALIZED (SELECT h.id, h.project_id AS pid, h.queued_at, h.created_at, h.run_next_at, "
        f"{number} AS rnk FROM ({heads}) h)",
        f"busy AS (SELECT project_id AS pid, COUNT(*) AS n FROM {table} WHERE active_provider_id = %s "
        f"AND status = {PROCESSING} GROUP BY project_id)",
        "ranked AS MATERIALIZED (SELECT heads.id, CASE WHEN heads.run_next_at IS NULL THEN 1 ELSE 0 END AS pushed, "
        f"heads.run_next_at, CAST(COALESCE(b.n, 0) + heads.rnk AS {real}) / pr.share_weight AS share, "
        "CASE WHEN t.served_at IS NULL THEN 0 ELSE 1 END AS served, t.served_at, heads.queued_at, heads.created_at "
        f"FROM heads INNER JOIN {projects} pr ON pr.id = heads.pid LEFT JOIN busy b ON b.pid = heads.pid "
        f"LEFT JOIN {turns} t ON t.provider_id = %s AND t.project_id = heads.pid WHERE 1 = 1{excluded} "
        f"ORDER BY {order}{' LIMIT %s' if pick is not None else ''})",
    ]
    params = [*heads_params, provider_id, provider_id, *kinds, *([pick] if pick is not None else [])]
    if recursive:
        body, direct_params = direct_projects_sql(provider_id)
        ctes.insert(0, body)
        params = [*direct_params, *params]
    # The ranked heads lead, as a few key lookups: given a join alone, PostgreSQL hashed
    # the whole jobs table against them. It reads an ARRAY(…) once, before the scan it
    # keys, and is kept off the status indexes (`|| ''`: the status is checked again on
    # the row it locks, not searched by); SQLite keeps a CROSS JOIN's order.
    pending = f"j.status = {PENDING}"
    if connection.vendor == "postgresql":
        pending = f"j.status || '' = {PENDING} AND j.id = ANY(ARRAY(SELECT id FROM ranked))"
    sql = (
        f"WITH {'RECURSIVE ' if recursive else ''}{', '.join(ctes)} "
        f"SELECT {columns}, (SELECT COUNT(DISTINCT pid) FROM heads) FROM ranked CROSS JOIN {table} j "
        f"INNER JOIN {projects} p ON p.id = j.project_id WHERE j.id = ranked.id AND {pending} "
        "ORDER BY ranked.pushed ASC, ranked.run_next_at ASC, ranked.share ASC, ranked.served ASC, ranked.served_at ASC, "
        "j.queued_at ASC, j.created_at ASC, j.id ASC"
    )
    return sql, params


def record_turns(provider_id: int, project_ids, at) -> None:
    """These projects were just served by this provider (one upsert). Written only when
    projects contend: a provider that feeds one project writes nothing extra."""
    from queue_app.engine import model_sql

    project_ids = sorted(set(project_ids))
    if not project_ids:
        return
    table = ShareTurn._meta.db_table
    served = ShareTurn._meta.get_field("served_at").get_db_prep_value(at, connection)
    rows = ", ".join(["(%s, %s, %s)"] * len(project_ids))
    params = [value for project_id in project_ids for value in (provider_id, project_id, served)]
    with model_sql.cursor() as statement:
        statement.execute(
            f"INSERT INTO {table} (provider_id, project_id, served_at) VALUES {rows} "
            "ON CONFLICT (provider_id, project_id) DO UPDATE SET served_at = excluded.served_at",
            params,
        )
