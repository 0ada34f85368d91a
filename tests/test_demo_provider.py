"""The demo provider: offline, real outputs, and an exact ledger of its own calls."""

import io
import time

import pytest
from PIL import Image

from queue_app.providers import adapter_for, demo
from queue_app.providers.base import Finished, PermanentError, ResolvedJob, Running, Submitted, TransientError


def job(**options) -> ResolvedJob:
    fields = dict(job_id="j1", provider_id=7, family="demo", kind="image", model="demo-image", prompt="a red fox")
    fields.update({k: options.pop(k) for k in list(options) if k in ResolvedJob.__dataclass_fields__})
    return ResolvedJob(**fields, options={"latency_ms": 0, **options})


def test_it_is_found_through_the_family_registry():
    assert adapter_for("demo") is demo
    with pytest.raises(PermanentError):
        adapter_for("no-such-family")


def test_sync_mode_returns_a_real_png_in_the_requested_shape(settings, tmp_path):
    result = demo.submit(job(aspect_ratio="16:9"))
    assert isinstance(result, Finished)
    [output] = result.outputs
    image = Image.open(io.BytesIO(output.data))
    assert image.format == "PNG" and image.size[0] > image.size[1]
    assert output.content_type == "image/png"


def test_async_mode_returns_a_task_that_finishes_after_its_latency(settings):
    resolved = job(mode="async", latency_ms=300)
    submitted = demo.submit(resolved)
    assert isinstance(submitted, Submitted)
    assert isinstance(demo.check(submitted.task_id, resolved), Running)
    time.sleep(0.35)
    finished = demo.check(submitted.task_id, resolved)
    assert isinstance(finished, Finished) and finished.outputs[0].kind == "image"


def test_layers_model_returns_a_composite_and_transparent_layers():
    result = demo.submit(job(model="demo-layers", layers=4))
    roles = [o.role for o in result.outputs]
    assert roles == ["composite", "layer", "layer", "layer", "layer"]
    assert Image.open(io.BytesIO(result.outputs[1].data)).mode == "RGBA"


def test_text_and_audio_kinds():
    text = demo.submit(job(kind="text", model="demo-text")).outputs[0]
    audio = demo.submit(job(kind="audio", model="demo-audio")).outputs[0]
    assert text.kind == "text" and "Demo answer" in text.text
    assert audio.kind == "audio" and audio.data[:4] == b"RIFF"


@pytest.mark.parametrize("kind, error", [("transient", TransientError), ("permanent", PermanentError)])
def test_fail_rate_raises_the_configured_class(kind, error):
    with pytest.raises(error):
        demo.submit(job(fail_rate=1, fail_kind=kind))


def test_rate_limit_failure_carries_the_retry_after_delay():
    with pytest.raises(TransientError) as raised:
        demo.submit(job(fail_rate=1, fail_kind="rate_limit", retry_after=7))
    assert raised.value.delay == 7


def test_the_ledger_measures_the_true_peak_of_overlapping_calls():
    demo.reset_ledger(9)
    for start, end in [(0, 10), (5, 15), (9, 11), (10, 12), (20, 30)]:
        demo._ledger_write(9, f"S c{start} {start}")
        demo._ledger_write(9, f"E c{start} {end}")
    assert demo.peak_inflight(9) == 3
    assert len(demo.calls(9)) == 5
