"""Every read, one module per entity; callers import from the module itself
(`from queue_app.selectors.queue import queue_status`).

The Queue Monitor, the JSON API, the MCP tools and `manage.py queue_status` all call
`queue_status` (queue.py), at a constant number of queries whatever the number of jobs.
Derived states (Waiting, Queued, Running, Stalled, Detached and the waiting reason) are
defined once, SQL beside Python, in states.py. Ownership ("this user may see / change this
row") is visibility.py.
"""
