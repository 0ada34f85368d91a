"""Live events over the project WebSocket (Channels WebsocketCommunicator): who may
subscribe, isolation between projects, replay after a reconnect, the gap-free stream,
the relay of rows written by other processes, and progress ticks."""

import copy
import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from queue_app.engine import events, snapshot
from queue_app.models import Job, ProjectEvent, Status
from queue_app.providers.base import Running
from queue_app.queue_service import poller
from queue_app.web.live import relay
from remixstudio.asgi import application
from tests.conftest import make_drafts, make_project, make_provider
from tests.engine_helpers import flush_broadcasts, poll_once

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_layer(settings, monkeypatch):
    # A fresh layer per test (each test has its own event loop); the background relay
    # is off so a test drives relay_once() itself.
    settings.CHANNEL_LAYERS = copy.deepcopy(settings.CHANNEL_LAYERS)
    # The consumers' database calls run in executor threads; without persistent
    # connections they close theirs, and the test database can be dropped at the end.
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    settings.LIVE_RELAY_SECONDS = 0
    relay.reset()
    yield
    relay.reset()


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def socket(user, project_id, query="", origin="http://testserver"):
    headers = [(b"origin", origin.encode())]
    if user is not None:
        cookie = await sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    path = f"/ws/projects/{project_id}/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


def emit_events(project_id, n, *, broadcast=True):
    """n job events on a project, as a transition would write them. Without `broadcast`
    it is what a worker process's commit looks like from daphne in the embedded mode:
    the rows exist, the in-memory broadcast never arrives here."""
    real = events.broadcast
    if not broadcast:
        events.broadcast = lambda rows: None
    try:
        with transaction.atomic():
            job = Job.objects.filter(project_id=project_id).first()
            rows = events.emit_many(project_id, [("job.started", job.id, Status.PENDING, {})] * n)
    finally:
        events.broadcast = real
    return [row.seq for row in rows]


async def emit(project_id, n=1, *, broadcast=True):
    return await sync_to_async(emit_events)(project_id, n, broadcast=broadcast)


async def events_received(communicator, n) -> list[dict]:
    return [await communicator.receive_json_from(timeout=5) for _ in range(n)]


@pytest.fixture
def projects(owner):
    provider = make_provider(owner)
    a, b = make_project(owner, provider, name="A"), make_project(owner, provider, name="B")
    make_drafts(a, 1)
    make_drafts(b, 1)
    return a, b


async def test_the_owner_subscribes_and_receives_events_with_sequence_numbers(owner, projects):
    a, _ = projects
    communicator, connected, _ = await socket(owner, a.id)
    assert connected
    hello = await communicator.receive_json_from()
    assert hello == {"type": "hello", "project": a.id, "seq": 0}
    await emit(a.id, 2)
    first, second = await events_received(communicator, 2)
    assert (first["type"], first["project"], first["seq"], first["status"]) == ("event", a.id, 1, "pending")
    assert second["seq"] == 2 and first["job"]
    await communicator.disconnect()


async def test_one_commits_events_of_a_project_go_out_as_one_group_message_and_arrive_each(owner, projects, monkeypatch):
    a, _ = projects
    communicator, connected, _ = await socket(owner, a.id)
    assert connected
    await communicator.receive_json_from()
    layer = get_channel_layer()
    sends, real = [], layer.group_send

    async def counted(group, message):
        sends.append(message["type"])
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", counted)
    await emit(a.id, 3)  # three events in one commit, as a handover writes two
    assert [(e["type"], e["seq"]) for e in await events_received(communicator, 3)] == [("event", 1), ("event", 2), ("event", 3)]
    assert sends == ["project.events"]
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_an_outsider_is_refused_and_receives_nothing(owner, outsider, projects):
    a, _ = projects
    for user in (outsider, None):
        communicator, connected, code = await socket(user, a.id)
        assert not connected and code == 4403
        await emit(a.id)
        assert await communicator.receive_nothing(timeout=0.3)
    layer = get_channel_layer()
    if hasattr(layer, "groups"):  # in-memory layer: nobody joined the group
        assert not layer.groups.get(events.group_name(a.id))


async def test_a_foreign_origin_is_refused(owner, projects):
    a, _ = projects
    _, connected, _ = await socket(owner, a.id, origin="https://evil.example")
    assert not connected


async def test_staff_may_subscribe_to_any_project(staff, projects):
    communicator, connected, _ = await socket(staff, projects[0].id)
    assert connected
    await communicator.disconnect()


async def test_an_event_for_project_a_never_reaches_a_socket_of_project_b(owner, projects):
    a, b = projects
    on_a, _, _ = await socket(owner, a.id)
    on_b, _, _ = await socket(owner, b.id)
    await on_a.receive_json_from()
    await on_b.receive_json_from()
    await emit(a.id, 3)
    assert [e["project"] for e in await events_received(on_a, 3)] == [a.id] * 3
    assert await on_b.receive_nothing(timeout=0.5)
    await on_a.disconnect()
    await on_b.disconnect()


async def test_a_reconnecting_client_gets_what_it_missed(owner, projects):
    a, _ = projects
    communicator, _, _ = await socket(owner, a.id)
    await communicator.receive_json_from()
    await emit(a.id, 3)
    seen = [e["seq"] for e in await events_received(communicator, 3)]
    await communicator.disconnect()
    await emit(a.id, 2)  # missed while away
    communicator, _, _ = await socket(owner, a.id, query=f"after={seen[-1]}")
    assert (await communicator.receive_json_from())["seq"] == 5
    assert [e["seq"] for e in await events_received(communicator, 2)] == [4, 5]
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


async def test_a_client_too_far_behind_is_told_to_resync(owner, projects):
    a, _ = projects
    await emit(a.id, 4)
    await sync_to_async(lambda: ProjectEvent.objects.filter(project=a, seq__lte=2).delete())()  # pruned
    communicator, _, _ = await socket(owner, a.id, query="after=1")
    await communicator.receive_json_from()
    assert await communicator.receive_json_from() == {"type": "resync", "project": a.id, "seq": 4}
    await communicator.disconnect()


async def test_the_stream_is_gap_free_and_without_duplicates(owner, projects):
    a, _ = projects
    communicator, _, _ = await socket(owner, a.id)
    await communicator.receive_json_from()
    await emit(a.id, 3, broadcast=False)  # three rows, their messages lost
    rows = await sync_to_async(lambda: [events.as_message(r) for r in ProjectEvent.objects.filter(project=a)])()
    layer = get_channel_layer()
    await layer.group_send(events.group_name(a.id), {"type": "project.event", "event": rows[2]})
    assert [e["seq"] for e in await events_received(communicator, 3)] == [1, 2, 3]  # the gap is read from the rows
    await layer.group_send(events.group_name(a.id), {"type": "project.event", "event": rows[1]})
    assert await communicator.receive_nothing(timeout=0.3)  # a late duplicate is dropped
    await communicator.disconnect()


async def test_the_relay_delivers_rows_written_by_other_processes(owner, projects):
    a, b = projects
    communicator, _, _ = await socket(owner, a.id)
    await communicator.receive_json_from()
    await emit(a.id, 2, broadcast=False)
    await emit(b.id, 1, broadcast=False)  # nobody subscribes to B: not relayed, not queried
    assert await communicator.receive_nothing(timeout=0.2)
    assert await relay.relay_once() == 1
    assert [e["seq"] for e in await events_received(communicator, 2)] == [1, 2]
    assert await relay.relay_once() == 0  # nothing new
    await communicator.disconnect()
    assert await relay.relay_once() == 0


def detach(project, *, task_id="task-1", slot=0) -> Job:
    """The project's draft as a detached job whose next check is due."""
    job = Job.objects.get(project=project)
    now = timezone.now()
    Job.objects.filter(id=job.id).update(
        status=Status.PROCESSING,
        active_provider=project.provider,
        slot=slot,
        lease_token=uuid.uuid4(),
        task_id=task_id,
        task_observed_at=now,
        next_poll_at=now,
        attempts=1,
        resolved=snapshot.build(job, project, project.provider),
    )
    return job


async def test_a_polled_progress_tick_reaches_open_sockets_without_an_event_row(owner, projects, monkeypatch):
    a, _ = projects
    job = await sync_to_async(detach)(a)

    class Adapter:
        @staticmethod
        def check(task_id, request):
            return Running(progress=0.25)

    monkeypatch.setattr(poller, "adapter_for", lambda family: Adapter)
    communicator, _, _ = await socket(owner, a.id)
    await communicator.receive_json_from()
    assert await sync_to_async(poll_once)() == 1
    [tick] = await events_received(communicator, 1)
    assert (tick["type"], tick["job"], tick["progress"]) == ("progress", str(job.id), 0.25)
    stored = await sync_to_async(lambda: Job.objects.values_list("progress", flat=True).get(id=job.id))()
    assert stored == 0.25
    assert await sync_to_async(lambda: ProjectEvent.objects.filter(kind="job.progress").count())() == 0
    await communicator.disconnect()


async def test_the_relay_sends_progress_another_process_wrote_once_per_change(owner, projects):
    # Embedded set-up: the queue service's (or a worker's) progress broadcast stays in its
    # own process; the job row has the fraction, and the relay sends it on.
    a, b = projects
    job = await sync_to_async(detach)(a)
    await sync_to_async(lambda: Job.objects.filter(id=job.id).update(progress=0.5))()
    other = await sync_to_async(detach)(b, slot=1)
    await sync_to_async(lambda: Job.objects.filter(id=other.id).update(progress=0.3))()
    communicator, _, _ = await socket(owner, a.id)
    await communicator.receive_json_from()
    assert await relay.relay_once() == 1  # B has no subscriber
    [tick] = await events_received(communicator, 1)
    assert (tick["type"], tick["job"], tick["progress"]) == ("progress", str(job.id), 0.5)
    assert await relay.relay_once() == 0  # unchanged: not sent again
    await sync_to_async(lambda: Job.objects.filter(id=job.id).update(progress=0.88))()
    assert await relay.relay_once() == 1
    assert (await events_received(communicator, 1))[0]["progress"] == 0.88
    await communicator.disconnect()


@pytest.mark.redis
def test_events_committed_on_a_worker_thread_reach_a_redis_subscriber_in_order(owner):
    """To Redis, a committing thread hands its events to the process's sender thread and
    goes on; a subscriber still gets every one, in commit order."""
    from asgiref.sync import async_to_sync

    project = make_project(owner, make_provider(owner))
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.group_name(project.id), channel)
    for seq in range(1, 6):
        events.broadcast([ProjectEvent(project_id=project.id, seq=seq, kind="job.claimed", status="processing", payload={})])
    assert flush_broadcasts(timeout=5)

    async def take(n):
        seqs = []
        while len(seqs) < n:
            message = await layer.receive(channel)
            seqs += [event["seq"] for event in message.get("events", [message.get("event")])]
        return seqs

    assert async_to_sync(take)(5) == [1, 2, 3, 4, 5]
