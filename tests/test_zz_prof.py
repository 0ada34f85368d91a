import cProfile, pstats, time, io, os
import pytest
from queue_app import services
from queue_app.engine import dispatch
from queue_app.models import Job, Provider, Status
from queue_app.worker import execute
from tests.conftest import make_drafts, make_project, make_provider, status_of

pytestmark = pytest.mark.django_db(transaction=True)

N = int(os.environ.get("PROF_N", "120"))

def test_zz_profile(owner, inline_tasks, monkeypatch):
    monkeypatch.setattr(execute, "CARRY_ON_BUDGET_SECONDS", 1000)
    provider = make_provider(owner, concurrency=1)
    Provider.objects.filter(id=provider.id).update(paused=True, family="demo", options={"latency_ms": 0})
    project = make_project(owner, provider, kind="text", model="demo-text")
    make_drafts(project, N)
    services.jobs_start(user=owner, project=project, all_drafts=True)
    Provider.objects.filter(id=provider.id).update(paused=False)
    with dispatch.refilled_by_caller(provider.id):
        [first] = dispatch.dispatch(provider.id, hold_one=True)
    prof = cProfile.Profile()
    t = time.perf_counter()
    if os.environ.get("PROF"):
        prof.enable()
    execute.run(*first)
    prof.disable()
    el = time.perf_counter() - t
    done = Job.objects.filter(status=Status.COMPLETED).count()
    print(f"\n{done} jobs in {el:.3f}s: {el/done*1000:.2f} ms/job")
    if os.environ.get("PROF"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(os.environ.get("PROF_SORT", "cumulative")).print_stats(os.environ.get("PROF_FILTER", ""), int(os.environ.get("PROF_LINES", "70")))
        print(s.getvalue())
