"""The chaos run's fake provider keeps exact books: concurrency from real intervals,
Retry-After windows, accepted submissions per job, and disconnects it notices."""

import threading
import time

import requests

from tests.fakes.chaos_provider import ChaosProvider


def post(fake, key, n, **kwargs):
    return requests.post(
        f"{fake.url}/v1/images/generations",
        json={"model": "gpt-image-1", "prompt": f"chaos-job-{n} a fox"},
        headers={"Authorization": f"Bearer {key}"},
        **kwargs,
    )


def settle(fake, key, entries):
    """The fake writes its ledger line just after the answer leaves: wait for it."""
    import time

    deadline = time.monotonic() + 5
    while len(fake.entries(key, "create")) < entries and time.monotonic() < deadline:
        time.sleep(0.01)


def post_at_once(fake, key, tokens):
    threads = [threading.Thread(target=post, args=(fake, key, n)) for n in tokens]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_it_measures_concurrency_from_exact_intervals():
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("k", family="openai", latency=(0.3, 0.3))
        post_at_once(fake, "k", range(3))
        post(fake, "k", 9)  # after the others: no overlap
        settle(fake, "k", 4)
        assert fake.peak_inflight("k") == 3
        assert fake.submissions_per_job("k") == {"0": 1, "1": 1, "2": 1, "9": 1}
    finally:
        fake.stop()


def test_it_counts_creates_inside_a_retry_after_window():
    fake = ChaosProvider(seed=1).start()
    try:
        record = fake.configure("k", family="openai", latency=(0, 0), create_faults={"429": 1.0}, retry_after=5)
        first = post(fake, "k", 1)
        assert first.status_code == 429 and first.headers["Retry-After"] == "5"
        record.create_faults = {}
        post(fake, "k", 2)  # at once: already on its way when the 429 went out
        time.sleep(0.4)
        post(fake, "k", 3)  # later, but still inside the window: a violation
        settle(fake, "k", 3)
        assert len(fake.creates_in_flight_at_429("k")) == 1
        assert [row["job"] for row in fake.retry_after_violations("k")] == ["3"]

        # Had the client recorded the 429 only half a second later, create 3 was already
        # past its check: in flight, not a violation.
        def recorded_late(row):
            return row["end"] + 0.5

        assert fake.retry_after_violations("k", known=recorded_late) == []
        assert sorted(row["job"] for row in fake.creates_in_flight_at_429("k", known=recorded_late)) == ["2", "3"]
        assert fake.submissions_per_job("k") == {"2": 1, "3": 1}
    finally:
        fake.stop()


def test_a_client_that_gives_up_ends_the_interval_and_async_orphans_are_counted():
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("s", family="openai", latency=(3, 3))
        try:
            post(fake, "s", 1, timeout=0.3)
        except requests.Timeout:
            pass
        fake.configure("a", family="replicate", latency=(5, 5))
        created = requests.post(
            f"{fake.url}/v1/predictions",
            json={"version": "m", "input": {"prompt": "chaos-job-4 x"}},
            headers={"Authorization": "Bearer a"},
        )
        assert created.status_code == 201 and created.json()["status"] in ("starting", "processing")
        import time

        time.sleep(0.3)
        [(start, end)] = fake.intervals("s")
        assert end - start < 1.5  # the fake noticed the client leave, well before 3 s
        assert fake.orphans("a") == 1  # created, never polled
        requests.get(f"{fake.url}/v1/predictions/{created.json()['id']}", headers={"Authorization": "Bearer a"})
        assert fake.orphans("a") == 0 and len(fake.intervals("a")) == 1
    finally:
        fake.stop()


def test_a_task_failure_carried_by_the_create_answer_entitles_a_resubmission():
    """With `Prefer: wait` the create's own answer can say `failed`; no poll ever sees it,
    and the client is still right to submit again."""
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("w", family="replicate", latency=(0.1, 0.1), task_fail_rate=1.0)
        fake.configure("ok", family="replicate", latency=(0.1, 0.1))
        answers = [
            requests.post(
                f"{fake.url}/v1/predictions",
                json={"version": "m", "input": {"prompt": f"chaos-job-{n} x"}},
                headers={"Authorization": f"Bearer {key}", "Prefer": "wait=5"},
            ).json()
            for n, key in ((4, "w"), (5, "ok"))
        ]
        settle(fake, "ok", 1)
        assert [answer["status"] for answer in answers] == ["failed", "succeeded"]
        assert fake.resubmission_causes() == {"4": 1}
    finally:
        fake.stop()


def test_a_slowly_sent_answer_stops_counting_once_its_last_byte_is_out():
    """The client may take the next job the moment it holds the answer: a call counted in
    flight past that point would read as two calls in one slot."""
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("k", family="openai", latency=(0, 0), create_faults={"slow_body": 1.0}, slow_seconds=1.0)
        answer = post(fake, "k", 1)
        received = time.time()
        assert answer.status_code == 200 and answer.json()["data"]
        settle(fake, "k", 1)
        [(start, end)] = fake.intervals("k")
        assert end - start >= 0.9  # the body really trickled
        assert end <= received
    finally:
        fake.stop()


def test_the_calls_that_crowd_past_a_limit_are_named():
    fake = ChaosProvider(seed=1).start()
    try:
        fake.configure("k", family="openai", latency=(0.3, 0.3))
        post_at_once(fake, "k", range(3))
        settle(fake, "k", 3)
        [crowd] = fake.crowds("k", above=2)
        assert sorted(span["job"] for span in crowd) == ["0", "1", "2"]
        assert fake.crowds("k", above=3) == []
    finally:
        fake.stop()
