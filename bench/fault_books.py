"""The books of bench/chaos_faults.py's scenarios, on top of bench/chaos.py's.

`FaultBooks` is mixed into `FaultRun` before `Chaos`: its `report()` prints the soak's
books, then "fault → every affected job dispatchable or running again" (p100), no process
exited, and the scenario's own (`books_<n>`): broker tasks lost and live events resuming
(5), no half-written file or album item without its file (6), no early heal (7).
"""

from bench.chaos_books import line

DISK_FULL_WORDS = "media disk is full"


class FaultBooks:
    """The scenario's checks; the run's state lives on the `FaultRun` it is mixed into."""

    def resubmission_cause(self, outcome: str, reason: str) -> bool:
        # A synchronous provider's result that found the disk full is paid for again.
        return super().resubmission_cause(outcome, reason) or (outcome == "local" and DISK_FULL_WORDS in reason)

    def report(self):
        from django.db import close_old_connections

        close_old_connections()
        print(f"# scenario {self.scenario}")
        super().report()
        times = [t for fault in self.faults for t in fault["recovered"].values()]
        affected = sum(len(fault["rows"]) for fault in self.faults)
        line(
            "fault_to_dispatchable_p100",
            f"{max(times, default=0):.2f}",
            "s",
            f"{affected} affected job(s): every one healed, re-claimed, renewed, polled or finished again",
        )
        unrecovered = affected - len(times)
        self.check("fault recovered", unrecovered == 0, f"{unrecovered} affected job(s) never touched again")
        exited = sorted(name for name, gone in self.exited.items() if gone)
        line("processes_exited", len(exited), "", f"must be 0 {exited}")
        self.check("no process exits", not exited, f"{exited}")
        getattr(self, f"books_{self.scenario}")()

    def books_4(self):
        pass

    def books_5(self):
        fault = self.faults[0] if self.faults else {}
        line("broker_tasks_lost", fault.get("broker_tasks_lost", 0), "tasks", "queued in Redis when it restarted")
        live = getattr(self, "live_after_restart", {})
        line("live_event_after_restart", f"{live.get('seconds', float('nan')):.2f}", "s", f"{live}")
        self.check("live events resume", "seconds" in live, f"no live event after the restart: {live}")

    def books_6(self):
        from queue_app.models import AlbumItem, Job, JobAttempt

        media = self.var / "media"
        hit = JobAttempt.objects.filter(job__owner=self.user, reason__contains=DISK_FULL_WORDS)
        failed_full = Job.objects.filter(owner=self.user, status="failed", error__contains=DISK_FULL_WORDS).count()
        line("disk_full_attempts", hit.count(), "attempts", f"{hit.values('job_id').distinct().count()} jobs waited")
        line("failed_disk_full", failed_full, "jobs", "failed with the reason after their attempts (reported)")
        parts = [p for p in (media / "tmp").rglob("*")] if (media / "tmp").exists() else []
        line("half_written_files", len(parts), "files", "must be 0")
        self.check("half-written files", not parts, f"{len(parts)} left in media/tmp")
        names = set()
        missing = 0
        for file_name, poster in AlbumItem.objects.filter(owner=self.user).values_list("file", "poster"):
            for name in (file_name, poster):
                if name:
                    names.add(name)
                    missing += not (media / name).is_file()
        stray = [p for p in (media / "album").rglob("*") if p.is_file() and str(p.relative_to(media)) not in names]
        line("album_items_without_file", missing, "items", "must be 0")
        line("files_without_album_item", len(stray), "files", "must be 0")
        self.check("album items without file", missing == 0, f"{missing}")
        self.check("files without album item", not stray, f"{len(stray)}")
        self.check("the disk filled", hit.exists(), "no job met the full disk: the fault did not bite")

    def books_7(self):
        from queue_app.models import JobAttempt, ProjectEvent

        interrupted = JobAttempt.objects.filter(job__owner=self.user, outcome="interrupted").count()
        lease_lost = JobAttempt.objects.filter(job__owner=self.user, outcome="lost", reason__contains="lease lost").count()
        healed = ProjectEvent.objects.filter(project__owner=self.user, kind="job.healed").count()
        released = self.procs["queue"].log().count("worker cluster(s) gone")
        line("early_heals", healed, "jobs", "must be 0: no process died, so no lease ran out")
        line("attempts_interrupted", interrupted, "attempts", "must be 0")
        line("leases_lost", lease_lost, "attempts", "must be 0")
        line("live_clusters_declared_dead", released, "times", "must be 0")
        self.check(
            "early heals", healed + interrupted + lease_lost + released == 0, f"{healed}/{interrupted}/{lease_lost}/{released}"
        )
        if healed + interrupted + lease_lost:
            self.explain_heals()

    def explain_heals(self):
        """What each healed or interrupted job went through, on the database's clock: the
        private database is gone after the run, and this is what tells why."""
        from django.db.models import Q

        from queue_app.models import JobAttempt, ProjectEvent

        odd = Q(kind="job.healed") | Q(job_id__in=JobAttempt.objects.filter(outcome__in=["interrupted", "lost"]).values("job_id"))
        job_ids = set(ProjectEvent.objects.filter(project__owner=self.user).filter(odd).values_list("job_id", flat=True))
        for job_id in sorted(map(str, job_ids)):
            print(f"#   job {job_id}:")
            events = ProjectEvent.objects.filter(job_id=job_id).order_by("seq")
            for at, kind, status, payload in events.values_list("created_at", "kind", "status", "payload"):
                print(f"#     {at:%H:%M:%S.%f} event {kind} {status} {payload}")
            attempts = JobAttempt.objects.filter(job_id=job_id).order_by("number")
            for number, worker, began, ended, outcome, reason in attempts.values_list(
                "number", "worker", "started_at", "finished_at", "outcome", "reason"
            ):
                ended = f"{ended:%H:%M:%S.%f}" if ended else "-"
                print(f"#     attempt {number} {worker} {began:%H:%M:%S.%f} → {ended} {outcome} {reason[:120]}")
