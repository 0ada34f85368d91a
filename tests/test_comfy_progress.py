"""ComfyUI step progress (the WebSocket's `progress` value/max and the executing node) on
the job: stored at most once a second per job plus the final value, broadcast on the
project socket, shown as a bar on the job row, the job page and the monitor."""

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client

from comfy_app import progress, ws
from comfy_app.models import ComfyRun
from comfy_app.runner.instance import client_for
from queue_app.engine import events
from queue_app.models import Job, Status
from tests.engine_helpers import stop_listeners
from tests.fakes.comfyui import Script
from tests.test_comfy_runner import comfy_project, done, drive, job_of, start, wait_fake
from tests.test_comfy_runner import fake as fake  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_is_let_through_at_most_once_a_second_and_the_last_value_when_the_prompt_ends():
    clock = Clock()
    throttle = progress.Throttle(clock=clock)
    writes = []
    for step in range(30):  # 30 steps of 40, one each 0.05 s
        clock.now = 100 + step * 0.05
        writes.append(throttle.offer("p", "3", step / 40))
    assert [w for w in writes if w] == [("3", 0.0), ("3", 0.5)]  # at 0 s and at 1 s
    assert throttle.final("p") == ("3", 29 / 40)  # the end always stores the last value seen
    assert throttle.final("p") is None


def test_parse_reads_the_recorded_progress_and_executing_messages():
    prompt = "b09684fd-892d-4504-806b-84f1dfd1e5b6"
    assert progress.parse({"type": "progress", "data": {"value": 1, "max": 2, "prompt_id": prompt, "node": "2"}}) == (
        prompt,
        "2",
        0.5,
    )
    assert progress.parse({"type": "executing", "data": {"node": "2", "display_node": "2", "prompt_id": prompt}}) == (
        prompt,
        "2",
        None,
    )
    assert progress.parse({"type": "executing", "data": {"node": None, "prompt_id": prompt}}) is None
    assert progress.parse({"type": "progress", "data": {"value": 1, "max": 0, "prompt_id": prompt}}) is None


def test_a_running_prompts_steps_reach_the_job_through_the_instance_socket(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=2.5, steps=50))
    [job] = start(owner, project)
    stored = []
    lock = threading.Lock()

    def on_progress(prompt_id, node, fraction):
        with lock:
            stored.append(fraction)
        progress.persist(prompt_id, node, fraction)

    listeners = ws.Listeners(on_event=lambda instance_id: None, on_progress=on_progress)
    try:
        listeners.ensure(instance.id, instance.base_url, instance.client_id, client_for(instance))
        time.sleep(0.3)  # the socket is open before the prompt starts
        inline_tasks.run()
        wait_fake(fake, lambda: (Job.objects.get(id=job.id).progress or 0) > 0.2, timeout=5)
        assert 0 < job_of(job).progress < 1 and job_of(job).status == Status.PROCESSING
        assert ComfyRun.objects.get(job=job).progress_node == "node 1 (EmptyImage)"
        wait_fake(fake, lambda: fake.running is None and fake.runs, timeout=10)
        time.sleep(0.3)
    finally:
        stop_listeners(listeners)
    # 50 steps over 2.5 s: a write each second or so, and the last value at the end
    assert 2 <= len(stored) <= 5 and stored[-1] == 49 / 50
    assert job_of(job).progress == 49 / 50
    drive(instance, inline_tasks, done(job))
    assert job_of(job).status == Status.COMPLETED and job_of(job).progress == 1.0


def test_a_progress_tick_reaches_the_project_socket_with_its_node(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    [job] = start(owner, project)
    inline_tasks.run()
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.group_name(project.id), channel)
    assert progress.persist(job_of(job).task_id, "2", 0.4)
    message = async_to_sync(layer.receive)(channel)
    event = message["event"]
    assert (event["job"], event["progress"], event["detail"]) == (str(job.id), 0.4, "node 2 (ImageInvert)")
    assert job_of(job).progress == 0.4
    assert not progress.persist("not-a-prompt-of-ours", "2", 0.4)


def test_the_job_row_job_page_and_monitor_show_the_progress_bar(owner, fake, inline_tasks):
    project, instance = comfy_project(owner, fake)
    fake.plan(Script(seconds=30))
    [job] = start(owner, project)
    inline_tasks.run()
    progress.persist(job_of(job).task_id, "2", 0.4)
    client = Client()
    client.force_login(owner)
    row = client.get(f"/projects/{project.id}/?fragment=1").content.decode()
    assert 'style="width:40%"' in row and "data-progress-label>40%" in row
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert 'style="width:40%"' in page and "data-progress-label>40%" in page
    assert '<progress max="100" value="40"' in client.get("/queue/").content.decode()
