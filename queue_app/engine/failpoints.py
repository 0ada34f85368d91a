"""Named failpoints: FAILPOINTS=name[,name…] makes the process exit hard at that point.

The chaos tests use them to kill a worker at the exact instruction that matters:
  after_claim_before_submit, after_submit_before_task_id, after_task_id_before_attempt_closed,
  after_download_before_album,
  after_album_before_complete, mid_poll
"""

import os

from django.conf import settings

NAMES = {
    "after_claim_before_submit",
    "after_submit_before_task_id",
    "after_task_id_before_attempt_closed",  # inside the detach's transaction
    "after_download_before_album",
    "after_album_before_complete",
    "mid_poll",
    "push_after_close",  # a finish recorded, its notifications not sent yet
}


def hit(name: str) -> None:
    assert name in NAMES, name
    active = settings.FAILPOINTS or [p for p in os.getenv("FAILPOINTS", "").split(",") if p]
    if name in active:
        os._exit(137)
