"""The chaos run's money books (docs/money.md): every claim has its one ledger line, and
a line still reserved belongs to a job still processing. A second settlement cannot be
written (one line per claim token, ended by compare-and-set); these books show the run
kept to that: no live line of an ended job, no completed job without a settled line."""

from collections import Counter


def ledger_books(jobs, line, check) -> None:
    from queue_app.models import Charge, Status

    lines = Charge.objects.filter(job_id__in=jobs.values("id"))
    states = Counter(lines.values_list("state", flat=True))
    line("ledger_lines", sum(states.values()), "claims")
    for state in ("settled", "released", "held", "reserved"):
        line(f"ledger_{state}", states.get(state, 0), "lines")
    tokens = lines.values("claim_token").distinct().count()
    check("ledger one line per claim", tokens == sum(states.values()), f"{sum(states.values()) - tokens} repeated")
    live_of_ended = lines.filter(state="reserved").exclude(job_id__in=jobs.filter(status=Status.PROCESSING).values("id"))
    line("ledger_live_of_ended_jobs", live_of_ended.count(), "lines", "must be 0")
    check("ledger live lines", not live_of_ended.exists(), f"{live_of_ended.count()} reserved lines of jobs no longer processing")
    settled_jobs = lines.filter(state="settled").values("job_id")
    unsettled = jobs.filter(status=Status.COMPLETED).exclude(id__in=settled_jobs)
    line("ledger_completed_unsettled", unsettled.count(), "jobs", "must be 0")
    check("ledger settlements", not unsettled.exists(), f"{unsettled.count()} completed jobs without a settled line")
    twice = Counter(lines.filter(state="settled").values_list("job_id", flat=True))
    line("ledger_jobs_settled_more_than_once", sum(1 for n in twice.values() if n > 1), "jobs", "each its own paid claim")
