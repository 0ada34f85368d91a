"""Finish notifications: Web Push to every device that switched notifications on.

- queue_app/engine/project_runs.py — project runs: opened when jobs become pending, closed once
  when the project settles; the close writes the outbox rows (in the engine because the
  state machine opens runs inside its own transaction);
- vapid.py — the key pair that signs our pushes;
- outbox.py — sending the outbox rows, and the queue service's notify step;
- devices.py — switching notifications on and off per browser, the test send;
- views.py, urls.py — Account → Preferences and the service worker.
"""
