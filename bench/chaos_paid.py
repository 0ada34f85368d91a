"""Extra paid submissions per provider family, from the fake's ledger: accepted creates of
a job beyond its first, less those that followed a task that failed at the provider (a
fresh submission is then what the job asked for). A family whose adapter can look a lost
submission up (engine/reconcile.py) must show 0; the others are explained by a kill or an
ambiguous answer (the `submissions` books)."""

from queue_app.engine.ambiguous import reconciled


def extra_paid_by_family(fake, family_of_token: dict) -> dict[str, int]:
    """{family: extra paid submissions}, every family of the run listed (0 included)."""
    failed = fake.failed_tasks_per_job()
    by_family = {family: 0 for family in set(family_of_token.values())}
    for token, creates in fake.submissions_per_job().items():
        family = family_of_token.get(token, "?")
        by_family[family] = by_family.get(family, 0) + max(0, creates - 1 - failed.get(token, 0))
    return by_family


def has_lookup(family: str) -> bool:
    return reconciled(family)
