"""The lease keeper of a running job: renewals, and leaving the provider call when the
lease is gone or may be (chaos-hosts scenario 3: a host cut off from the database)."""

import threading

from django.db import OperationalError

from queue_app.engine import leases
from tests.procs import wait_for


def test_a_worker_that_cannot_reach_the_database_leaves_the_provider_call_before_its_lease_can_run_out(settings, monkeypatch):
    settings.LEASE_TTL_SECONDS = 1.0
    settings.LEASE_RENEW_SECONDS = 0.2

    def unreachable(job_id, token):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(leases, "lease_renew", unreachable)
    left = threading.Event()
    keeper = leases.LeaseKeeper("job-1", "token-1", on_lost=left.set)
    with keeper:
        wait_for(left.is_set, timeout=5, interval=0.05, message="the worker to leave the call")
        # The other host heals only after the lease's expiry, which counts from the take.
        assert leases.time.monotonic() - keeper._started < settings.LEASE_TTL_SECONDS
    assert keeper.lost.is_set()


def test_a_worker_that_renews_keeps_its_call(settings, monkeypatch):
    settings.LEASE_TTL_SECONDS = 0.6
    settings.LEASE_RENEW_SECONDS = 0.1
    renewals = []
    monkeypatch.setattr(leases, "lease_renew", lambda job_id, token: renewals.append(1) or True)
    left = threading.Event()
    with leases.LeaseKeeper("job-1", "token-1", on_lost=left.set):
        wait_for(lambda: len(renewals) >= 10, timeout=5, interval=0.05, message="ten renewals")
    assert not left.is_set()


def test_a_worker_whose_job_was_taken_leaves_the_provider_call(settings, monkeypatch):
    settings.LEASE_RENEW_SECONDS = 0.1
    monkeypatch.setattr(leases, "lease_renew", lambda job_id, token: False)
    left = threading.Event()
    with leases.LeaseKeeper("job-1", "token-1", on_lost=left.set) as keeper:
        wait_for(left.is_set, timeout=5, interval=0.05, message="the worker to leave the call")
    assert keeper.lost.is_set()


def test_keepers_share_two_threads_of_the_process_instead_of_starting_their_own(settings, monkeypatch):
    monkeypatch.setattr(leases, "lease_renew", lambda job_id, token: True)
    with leases.LeaseKeeper("job-0", "token-0"):
        pass  # the process's renewer and watch are running from here on
    before = threading.active_count()
    for n in range(1, 50):
        with leases.LeaseKeeper(f"job-{n}", f"token-{n}"):
            assert threading.active_count() == before
    assert threading.active_count() == before


def test_two_jobs_of_one_process_are_renewed_each_and_lost_alone(settings, monkeypatch):
    settings.LEASE_RENEW_SECONDS = 0.1
    renewed = {"job-1": 0, "job-2": 0}

    def renew(job_id, token):
        renewed[job_id] += 1
        return job_id == "job-1"  # job-2 was taken from us

    monkeypatch.setattr(leases, "lease_renew", renew)
    first_left, second_left = threading.Event(), threading.Event()
    with leases.LeaseKeeper("job-1", "token-1", on_lost=first_left.set):
        with leases.LeaseKeeper("job-2", "token-2", on_lost=second_left.set):
            wait_for(second_left.is_set, timeout=5, interval=0.05, message="job-2's worker to leave its call")
            wait_for(lambda: renewed["job-1"] >= 3, timeout=5, interval=0.05, message="job-1's renewals")
    assert not first_left.is_set()


def test_a_renewal_that_fails_unexpectedly_leaves_the_other_jobs_renewed(settings, monkeypatch):
    # One renewer serves every job of the process: one job's odd failure must not end it.
    settings.LEASE_RENEW_SECONDS = 0.1
    renewed = []

    def renew(job_id, token):
        if job_id == "job-odd":
            raise ValueError("an answer nobody expected")
        renewed.append(job_id)
        return True

    monkeypatch.setattr(leases, "lease_renew", renew)
    with leases.LeaseKeeper("job-odd", "token-odd"), leases.LeaseKeeper("job-1", "token-1"):
        wait_for(lambda: renewed.count("job-1") >= 3, timeout=5, interval=0.05, message="job-1's renewals")
    with leases.LeaseKeeper("job-2", "token-2"):
        wait_for(lambda: "job-2" in renewed, timeout=5, interval=0.05, message="a later job's renewal")
