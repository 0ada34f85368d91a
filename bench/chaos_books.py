"""The chaos run's books: what the fake provider and the database say happened, checked.

`Books` is mixed into bench/chaos.py's `Chaos` (and so into the multi-host and fault runs,
which add their own books). `report()` prints one line per figure through `line`
(`chaos.<name> <value> <unit> (<comparison>)`) and records every assertion that fails in
`self.failures`: jobs lost, duplicate album items, concurrency over a provider's limit,
slots leaked, kill → dispatchable, Retry-After, unexplained paid submissions, the
sentinel key and prompts in logs.
"""

import json
import re
from collections import Counter

from bench.chaos_ledger import ledger_books
from bench.figures import emit, percentile

PROMPT_WORDS = "a lighthouse at dusk, oil on canvas"


def line(name: str, value, unit: str = "", comparison: str = "") -> None:
    emit(name, value, unit, comparison, prefix="chaos")


class Books:
    """The checks over a finished run; the run's state lives on the `Chaos` it is mixed into."""

    def check(self, name: str, ok: bool, detail: str):
        if not ok:
            self.failures.append(f"{name}: {detail}")

    def report(self):
        from django.db import close_old_connections

        from queue_app.models import Job

        close_old_connections()
        jobs = Job.objects.filter(owner=self.user)
        self.report_outcomes(jobs)
        self.report_album_items(jobs)
        self.report_concurrency(jobs)
        self.report_recoveries()
        self.report_retry_after()
        self.submissions(jobs)
        self.secrets(jobs)
        self.report_attempts()
        ledger_books(jobs, line, self.check)

    def report_outcomes(self, jobs):
        from queue_app.models import Status

        by_status = Counter(jobs.values_list("status", flat=True))
        line("seed", self.seed)
        line("jobs", self.args.jobs)
        line("wall_time", f"{self.elapsed:.1f}", "s")
        line("database", "postgresql" if self.stack.database_url.startswith("postgres") else "sqlite")
        line("broker", "redis" if self.stack.redis_url else "orm")
        for event in self.events:
            print(f"# {event}")
        line("completed", by_status.get(Status.COMPLETED, 0), "jobs")
        line("failed", by_status.get(Status.FAILED, 0), "jobs")
        reasons = Counter(
            (error.split(":")[0][:60] if error else "(no reason)")
            for error in jobs.filter(status=Status.FAILED).values_list("error", flat=True)
        )
        for reason, count in reasons.most_common(6):
            print(f"#   failed: {count} × {reason}")

        lost = (
            jobs.exclude(status__in=[Status.COMPLETED, Status.FAILED]).count()
            + jobs.filter(status=Status.FAILED, error="").count()
        )
        line("jobs_lost", lost, "jobs", "must be 0")
        self.check("jobs lost", lost == 0, f"{lost} job(s) neither completed nor failed with a reason")

    def report_album_items(self, jobs):
        from django.db.models import Count

        from queue_app.models import AlbumItem, Status

        per_output = AlbumItem.objects.filter(owner=self.user).values("job_id", "output_index").annotate(n=Count("id"))
        duplicates = sum(row["n"] - 1 for row in per_output if row["n"] > 1)
        completed_without = jobs.filter(status=Status.COMPLETED).exclude(album_items__isnull=False).count()
        extra_items = sum(
            max(0, row["n"] - 1) for row in AlbumItem.objects.filter(owner=self.user).values("job_id").annotate(n=Count("id"))
        )
        line("duplicate_album_items", duplicates + extra_items, "items", "must be 0")
        line("completed_without_album_item", completed_without, "jobs", "must be 0")
        self.check("duplicate album items", duplicates + extra_items == 0, f"{duplicates + extra_items}")
        self.check("completed without item", completed_without == 0, f"{completed_without}")

    def report_concurrency(self, jobs):
        from queue_app.models import Job, Status

        violations = 0
        closest_lines = []
        for provider, _, key in self.providers:
            peak = self.fake.peak_inflight(key)
            over = max(0, peak - provider.concurrency)
            violations += over
            line(f"peak_inflight.{provider.name}", peak, "calls", f"concurrency {provider.concurrency}")
            for crowd in self.fake.crowds(key, above=provider.concurrency)[:3]:
                self.explain_crowd(provider, crowd)
            closest = self.fake.closest_handover(key, provider.concurrency)
            if closest is not None:
                closest_lines.append(f"{provider.name} {closest * 1000:.0f} ms")
        line("concurrency_violations", violations, "calls over the limit", "must be 0")
        line(
            "closest_handover",
            ", ".join(closest_lines) or "none",
            "",
            "reported: a call that took the last free slot started this long after the call before it ended",
        )
        self.check("concurrency", violations == 0, f"{violations} call(s) over a provider's limit")

        leaked = jobs.filter(status=Status.PROCESSING).count() + Job.objects.filter(slot__isnull=False).count()
        line("slots_leaked_after_drain", leaked, "slots", "must be 0")
        self.check("slots leaked", leaked == 0, f"{leaked}")

    def recovery_times(self) -> tuple[list, list, list]:
        """Seconds from each kill to each affected job being dispatchable again: running jobs
        after a SIGKILL, running jobs after the SIGTERM, and claims not yet taken."""
        # A SIGTERM lets the worker finish what it runs: its jobs are not interrupted, so
        # they are reported on their own, not as recoveries.
        running_times = [
            t for k in self.kills if not k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "running"
        ]
        graceful_times = [t for k in self.kills if k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "running"]
        claimed_times = [
            t for k in self.kills if not k["graceful"] for (kind, _), t in k["recovered"].items() if kind == "claimed"
        ]
        return running_times, graceful_times, claimed_times

    def report_recoveries(self):
        running_times, graceful_times, claimed_times = self.recovery_times()
        kills = [k for k in self.kills if not k["graceful"]]
        line(
            "kills",
            len(kills),
            "SIGKILL",
            f"workers {sum(k['name'] != 'queue' for k in kills)}, queue service "
            f"{sum(k['name'] == 'queue' for k in kills)}{self.other_disruptions}",
        )
        line(
            "kill_to_dispatchable_p100",
            f"{max(running_times, default=0):.2f}",
            "s",
            f"goal < 15 s; {len(running_times)} running jobs interrupted",
        )
        line("kill_to_dispatchable_p50", f"{percentile(running_times, 50):.2f}", "s")
        line(
            "claimed_job_taken_p100",
            f"{max(claimed_times, default=0):.2f}",
            "s",
            f"jobs claimed but not yet taken by any worker at a kill, until a worker or healing took them; "
            f"{len(claimed_times)} jobs; CLAIM_TTL_SECONDS=10",
        )
        if self.graceful_stop_seconds is not None:
            line("sigterm_worker_exit", f"{self.graceful_stop_seconds:.2f}", "s", "SIGTERM to the exit of a qcluster (reported)")
        line(
            "sigterm_running_jobs_finished_p100",
            f"{max(graceful_times, default=0):.2f}",
            "s",
            f"graceful stop: {len(graceful_times)} running jobs finished by the stopping worker",
        )
        for kill in (k for k in self.kills if not k["graceful"]):
            slowest = max(((t, job_id) for (kind, job_id), t in kill["recovered"].items() if kind == "running"), default=None)
            if slowest and slowest[0] >= 10:
                print(
                    f"#   slow recovery after {'SIGTERM' if kill['graceful'] else 'SIGKILL'} {kill['name']}: job {slowest[1]} "
                    f"{slowest[0]:.1f} s"
                )
        self.check("kill to dispatchable", max(running_times, default=0) < 15, f"p100 {max(running_times, default=0):.1f} s")
        unrecovered = sum(len(k["pending"]["running"]) + len(k["pending"]["claimed"]) - len(k["recovered"]) for k in self.kills)
        self.check("recovered", unrecovered == 0, f"{unrecovered} interrupted job(s) never became dispatchable")

    def report_retry_after(self):
        retry_violations = 0
        known = self.rate_limit_known()
        for provider, _, key in self.providers:
            found = self.fake.retry_after_violations(key, known=known)
            retry_violations += len(found)
            if found:
                self.explain_retry_after(provider, key, found, known)
        sent_429 = sum(self.fake.create_outcomes(key).get("429", 0) for _, _, key in self.providers)
        in_flight = sum(len(self.fake.creates_in_flight_at_429(key, known=known)) for _, _, key in self.providers)
        all_429 = [row for row in self.fake.entries(kind="create") if row["outcome"] == "429"]
        lost_429 = sum(1 for row in all_429 if known(row) is None)
        line("retry_after_violations", retry_violations, "requests", f"must be 0; {sent_429} 429s sent")
        line(
            "rate_limits_lost_to_a_kill",
            lost_429,
            "429s",
            "reported: its worker was killed or lost its database before recording it",
        )
        line(
            "creates_in_flight_at_a_429",
            in_flight,
            "requests",
            "reported: sent by another worker before the 429's cool-down was recorded, or within 0.25 s of it",
        )
        self.check("Retry-After", retry_violations == 0, f"{retry_violations} create(s) inside a Retry-After window")

    def explain_retry_after(self, provider, key, found, known):
        """The creates of a provider inside a Retry-After window, and every 429 it sent."""
        print(f"#   Retry-After: {len(found)} create(s) of {provider.name} inside a window")
        t0 = self.started_wall
        for row in found:
            print(f"#     create of chaos-job-{row['job']} started +{row['start'] - t0:.3f} s ({row['outcome']})")
        for row in self.fake.entries(key, "create"):
            if row["outcome"] == "429":
                seen = known(row)
                print(
                    f"#     429 to chaos-job-{row['job']} sent +{row['end'] - t0:.3f} s, recorded "
                    f"{'never' if seen is None else f'+{seen - t0:.3f} s'}, window until "
                    f"+{row['end'] + row['retry_after'] - t0:.3f} s"
                )

    def report_attempts(self):
        from queue_app.models import JobAttempt, ProjectEvent

        outcomes = Counter()
        for _, _, key in self.providers:
            outcomes.update(self.fake.create_outcomes(key))
        print("# fake create outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        attempts = Counter(JobAttempt.objects.filter(job__owner=self.user).values_list("outcome", flat=True))
        print("# attempt outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(attempts.items())))
        line(
            "attempts_left_running",
            attempts.get("running", 0),
            "attempt rows",
            "reported: attempts whose worker died before healing recorded them",
        )
        orphans = sum(self.fake.orphans(key) for _, _, key in self.providers if self.fake.records[key].family == "replicate")
        line(
            "orphan_remote_tasks", orphans, "tasks", "created, never polled: ambiguous creates and kills before the id was stored"
        )
        events = ProjectEvent.objects.filter(project__owner=self.user).count()
        line("live_events", events, "rows")

    def rate_limit_known(self):
        """For a 429 the fake sent: when the queue knew of it. The worker that got it sets
        the provider's cool-down and then closes its attempt as rate_limited, so that
        attempt's end bounds the moment other workers' pre-submit checks could see it.
        Without such an attempt: None when a kill or a backend termination hit within
        2 s (the queue never learned of that 429; counted apart), else the moment it was
        sent (strict)."""
        from queue_app.models import JobAttempt

        closed = {}
        rows = JobAttempt.objects.filter(job__owner=self.user, outcome=JobAttempt.Outcome.RATE_LIMITED)
        for job_id, started, finished in rows.values_list("job_id", "started_at", "finished_at"):
            if finished is not None:
                closed.setdefault(str(job_id), []).append((started.timestamp(), finished.timestamp()))

        def known(row) -> float | None:
            job_id = str(self.job_by_token.get(row["job"]))
            ends = [finished for started, finished in closed.get(job_id, []) if started <= row["end"] <= finished]
            if ends:
                return max(row["end"], ends[0])
            if any(row["end"] - 0.5 <= at <= row["end"] + 2.0 for at in self.disruptions):
                return None
            return row["end"]

        return known

    def submissions(self, jobs):
        from queue_app.models import JobAttempt

        counts = self.fake.submissions_per_job()
        at_fake = self.fake.resubmission_causes()
        causes = Counter()
        for attempt_job, outcome, reason in JobAttempt.objects.filter(job__owner=self.user).values_list(
            "job_id", "outcome", "reason"
        ):
            if self.resubmission_cause(outcome, reason):
                causes[str(attempt_job)] += 1
        histogram = Counter(counts.values())
        extra = unexplained = by_kill = 0
        for token, k in counts.items():
            if k <= 1:
                continue
            job_id = str(self.job_by_token.get(token))
            allowed = at_fake.get(token, 0) + causes[job_id]
            extra += k - 1
            by_kill += min(k - 1, causes[job_id])
            if k - 1 > allowed:
                unexplained += (k - 1) - allowed
                self.explain_submissions(token, job_id)
        line(
            "submissions_per_job",
            " ".join(f"{n}×{c}" for n, c in sorted(histogram.items())),
            "",
            "accepted remote submissions: count×jobs",
        )
        line(
            "extra_submissions",
            extra,
            "submissions",
            f"{by_kill} after a kill/ambiguous attempt, rest after an ambiguous answer or a failed remote task",
        )
        line("unexplained_extra_submissions", unexplained, "submissions", "must be 0")
        self.check("submissions", unexplained == 0, f"{unexplained} extra submission(s) without a cause")
        self.paid_by_family(jobs)

    def paid_by_family(self, jobs):
        from bench.chaos_paid import extra_paid_by_family, has_lookup

        family_of_job = {str(job_id): family for job_id, family in jobs.values_list("id", "project__provider__family")}
        family_of_token = {token: family_of_job.get(str(job_id), "?") for token, job_id in self.job_by_token.items()}
        for family, extra in sorted(extra_paid_by_family(self.fake, family_of_token).items()):
            if has_lookup(family):
                line(f"extra_paid_submissions_{family}", extra, "submissions", "must be 0: a lookup before paying again")
                self.check(f"paid twice ({family})", extra == 0, f"{extra} extra paid submission(s) despite the lookup")
            else:
                line(f"extra_paid_submissions_{family}", extra, "submissions", "no lookup: each after a kill or lost answer")

    def resubmission_cause(self, outcome: str, reason: str) -> bool:
        """An attempt that explains one more paid submission of its job (the fault runs of
        bench/chaos_faults.py add theirs)."""
        return outcome in ("interrupted", "lost", "ambiguous")

    def explain_crowd(self, provider, crowd):
        """Print the calls that were in flight together over a provider's limit, and what the
        database recorded of their jobs (attempts: worker, times, outcome, reason)."""
        t0 = self.started_wall
        print(f"#   over the limit of {provider.name} ({provider.concurrency}): {len(crowd)} calls in flight")
        for span in sorted(crowd, key=lambda span: span["start"]):
            job_id = self.job_by_token.get(span["job"])
            print(
                f"#     call of chaos-job-{span['job']} {span['start'] - t0:8.3f}→{span['end'] - t0:8.3f} s "
                f"{span['outcome']} {span['task']}"
            )
            self.print_attempts(job_id, indent="#       ")

    def explain_submissions(self, token, job_id):
        """Print what the fake and the database saw of a job with unexplained submissions,
        so a red run can be read without re-running it."""
        t0 = self.started_wall
        print(f"#   unexplained: job {job_id} (chaos-job-{token})")
        for row in self.fake.entries(kind="create"):
            if row.get("job") == token:
                print(
                    f"#     create {row['start'] - t0:8.3f}→{row.get('end', row['start']) - t0:8.3f} s"
                    f" outcome={row['outcome']} worked={row.get('worked')} prediction={row.get('prediction', '')}"
                )
        self.print_attempts(job_id, indent="#     ")

    def print_attempts(self, job_id, *, indent: str):
        """A job's attempts as the database recorded them, on the run's time scale."""
        from queue_app.models import JobAttempt

        t0 = self.started_wall
        for attempt in JobAttempt.objects.filter(job_id=job_id).order_by("id"):
            started = attempt.started_at.timestamp() - t0
            finished = attempt.finished_at.timestamp() - t0 if attempt.finished_at else float("nan")
            print(
                f"{indent}attempt {attempt.number} {started:8.3f}→{finished:8.3f} s {attempt.outcome} "
                f"worker={attempt.worker} task={attempt.task_id} reason={attempt.reason[:160]!r}"
            )

    def secrets(self, jobs):
        from queue_app.models import JobAttempt, ProjectEvent

        texts = {name: proc.log() for name, proc in self.procs.items()}
        in_logs = sum(text.count(self.sentinel) for text in texts.values())
        stored = (
            jobs.filter(error__contains=self.sentinel).count()
            + JobAttempt.objects.filter(reason__contains=self.sentinel).count()
            + sum(
                self.sentinel in json.dumps(payload)
                for payload in ProjectEvent.objects.filter(project__owner=self.user).values_list("payload", flat=True)
            )
        )
        line("sentinel_key_in_logs", in_logs, "occurrences", "must be 0")
        line("sentinel_key_stored", stored, "rows", "must be 0")
        self.check("sentinel key", in_logs + stored == 0, f"{in_logs} in logs, {stored} stored")
        prompts = sum(len(re.findall(re.escape(PROMPT_WORDS), text)) for text in texts.values())
        line("prompts_in_logs", prompts, "occurrences", "must be 0")
        self.check("prompts in logs", prompts == 0, f"{prompts}")
        tracebacks = sum(text.count("Traceback") for text in texts.values())
        line("tracebacks_in_logs", tracebacks, "", "reported")
