"""Batches at scale (issue 29): 10,000 drafts made by the combinations generator in one
request (services/combinations.drafts_generate, bulk inserts), then the pages that show
them at 10,000 drafts and 10,000 album items: the project page (drafts paged by 50), the
Generate drafts page, the album (/album/, filtered and not) and the compare view, through
Django's test client in-process after warm-up (p50 over the runs).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m bench.batch_speed [--drafts 10000] [--runs 15]

It builds its own database (`bench_batch`, after BENCH_DB_PREFIX) and drops it; without
DATABASE_URL a temporary SQLite file.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.figures import emit  # noqa: E402
from bench.runner import prefixed  # noqa: E402

TMP = Path(tempfile.mkdtemp(prefix="batch-bench-"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "remixstudio.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")
on_server = bool(os.getenv("DATABASE_URL"))
os.environ["TEST_DB_NAME"] = os.getenv("BENCH_DB_NAME", prefixed("bench_batch")) if on_server else str(TMP / "bench.sqlite3")
os.environ.setdefault("ALLOWED_HOSTS", "testserver")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

GENERATE_GOAL_S = 2.0
PAGE_GOAL_MS = 300.0
WORKFLOW = [
    {"type": "prompt", "value": "a {red|green|blue|grey|gold} fox in __places__"},
    {"type": "reference", "value": "https://example.com/fox.png"},
    {"type": "aspect_ratio", "value": "1:1"},
    {"type": "aspect_ratio", "value": "16:9"},
    {"type": "seed", "value": 7},
]


def seed():
    from django.contrib.auth import get_user_model

    from queue_app.models import AccountSettings, Project, Provider
    from queue_app.services.wildcards import wildcard_list_save

    owner = get_user_model().objects.create_user("bench", password="x")
    AccountSettings.objects.create(user=owner)
    provider = Provider.objects.create(owner=owner, name="Demo", family="demo", options={})
    project = Project.objects.create(owner=owner, name="Batch", provider=provider, model="demo-image")
    wildcard_list_save(user=owner, name="places", values=["snow", "rain", "a forest", "a city"])
    return owner, project


def album_seed(project, n: int) -> None:
    from queue_app.models import AlbumItem

    rows = [
        AlbumItem(project=project, owner=project.owner, kind="text", text=f"out {i}", prompt=f"a fox number {i % 500}")
        for i in range(n)
    ]
    AlbumItem.objects.bulk_create(rows, batch_size=2000)


def time_generation(owner, project, drafts: int, rounds: int = 3) -> list[float]:
    from queue_app.models import Job
    from queue_app.services.combinations import drafts_generate

    times = []
    for _ in range(rounds):
        Job.objects.filter(project=project).delete()
        start = time.perf_counter()
        result = drafts_generate(user=owner, project=project, items=WORKFLOW, quantity=drafts, create=True)
        times.append(time.perf_counter() - start)
        assert len(result["job_ids"]) == drafts
    return times


def page_p50(client: Client, url: str, runs: int) -> float:
    for _ in range(2):
        assert client.get(url).status_code == 200, url
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        assert client.get(url).status_code == 200
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--drafts", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    stack = "postgresql" if on_server else "sqlite"
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        owner, project = seed()
        print(f"# load average (1 min) {os.getloadavg()[0]:.2f} ({os.cpu_count()} cpus)")
        times = time_generation(owner, project, args.drafts)
        best, median = min(times), statistics.median(times)
        note = f"median of 3 {median:.2f} s; 40 combinations cycled, 1,000 rows a statement, one live event"
        goal = f"< {GENERATE_GOAL_S:.0f} s"
        emit(f"generate_{args.drafts}_drafts", f"{best:.2f}", "s", note, stack=stack, goal=goal, met=best < GENERATE_GOAL_S)
        album_seed(project, args.drafts)
        client = Client()
        client.force_login(owner)
        pages = [
            ("project_page", f"/projects/{project.id}/"),
            ("generate_page", f"/projects/{project.id}/generate"),
            ("album_page", "/album/"),
            ("album_filtered", f"/album/?project={project.id}&q=fox+number&kind=text"),
            ("compare_page", f"/projects/{project.id}/compare"),
        ]
        for name, url in pages:
            p50 = page_p50(client, url, args.runs)
            note = f"{args.drafts} drafts and {args.drafts} album items"
            emit(f"{name}_p50", f"{p50:.1f}", "ms", note, stack=stack, goal=f"< {PAGE_GOAL_MS:.0f} ms", met=p50 < PAGE_GOAL_MS)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
