"""Factories: the rows a test needs, with the defaults every test would otherwise repeat.

Plain functions (no factory library): each makes real rows through the ORM. tests/conftest.py
re-exports them, so older tests that import them from there keep working; new tests import
them from here.
"""

from queue_app.models import AccountSettings, Job, Project, Provider


def make_user(django_user_model, username, **extra):
    """A user who logs in with the password "pw-<username>"."""
    user = django_user_model.objects.create_user(username=username, password="pw-" + username, **extra)
    AccountSettings.objects.create(user=user)
    return user


def make_provider(owner, *, name="Demo", family="demo", concurrency=1, **options):
    """A provider record; the demo family answers at once unless `latency_ms` says otherwise."""
    options.setdefault("latency_ms", 0)
    return Provider.objects.create(owner=owner, name=name, family=family, concurrency=concurrency, options=options)


def make_project(owner, provider=None, *, name="Project", kind="image", **fields):
    fields.setdefault("model", "demo-image" if provider is not None and provider.family == "demo" else "")
    return Project.objects.create(owner=owner, name=name, kind=kind, provider=provider, **fields)


def make_drafts(project, n=1, prompt="a red fox", **fields):
    return [Job.objects.create(project=project, owner=project.owner, prompt=f"{prompt} {i}", **fields) for i in range(n)]


def make_job(project, status, **fields):
    """One job put straight into `status` with the given columns (a fixture's state, not a
    transition: tests of the transitions start from drafts)."""
    [job] = make_drafts(project, 1)
    Job.objects.filter(id=job.id).update(status=status, **fields)
    job.refresh_from_db()
    return job
