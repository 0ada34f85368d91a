"""Durations and time bins computed by the database itself, natively on PostgreSQL and
SQLite: the history's histograms and charts (selectors/history.py) and the tallies of
deleted attempts (engine/attempt_tally.py) use the same expressions, so an attempt folded
into the tallies counts exactly as it did in the log (same bucket, same milliseconds).
"""

from django.db.models import F, FloatField, Func, IntegerField


class EpochSeconds(Func):
    """A timestamp as seconds since 1970, in the database's own arithmetic. Django's
    datetime subtraction and TruncMinute run a Python function per row on SQLite; over a
    day of attempts that cost the monitor a second and more (julianday is native)."""

    output_field = FloatField()
    template = "EXTRACT(EPOCH FROM %(expressions)s)"

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)", **extra)


class Seconds(Func):
    """`end - start` in seconds (a float), natively on PostgreSQL and SQLite."""

    output_field = FloatField()
    arg_joiner = " - "
    template = "(%(expressions)s)"

    def __init__(self, end, start):
        super().__init__(EpochSeconds(end), EpochSeconds(start))


class EpochBin(Func):
    """The number of the `step`-second bin a timestamp falls in (floor of epoch / step)."""

    output_field = IntegerField()

    def __init__(self, field, step: int):
        super().__init__(EpochSeconds(field), step=int(step))

    def as_sql(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="FLOOR(%(expressions)s / %(step)s)", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        # epochs are positive: truncation is the floor
        return super().as_sql(compiler, connection, template="CAST(%(expressions)s / %(step)s AS INTEGER)", **extra)


class LeBucket(Func):
    """The index of the first bound a value is at most (Prometheus' `le`), len(bounds) past
    the last bound or for NULL. On PostgreSQL one width_bucket over the negated bounds
    (width_bucket counts the bounds <= its operand; negated, the bounds >= the value),
    which evaluates the value once: a CASE of one WHEN per bound evaluated the duration up
    to 14 times a row and was most of the run-time histogram's query."""

    output_field = IntegerField()

    def __init__(self, expression, bounds):
        self.bounds = tuple(float(b) for b in bounds)
        super().__init__(expression)

    def as_sql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        whens = " ".join(f"WHEN ({sql}) <= {b!r} THEN {i}" for i, b in enumerate(self.bounds))
        return f"CASE {whens} ELSE {len(self.bounds)} END", list(params) * len(self.bounds)

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        negated = ",".join(repr(-b) for b in reversed(self.bounds))
        n = len(self.bounds)
        return f"COALESCE({n} - width_bucket(-({sql}), ARRAY[{negated}]::float8[]), {n})", list(params)


class Millis(Func):
    """`end - start` in whole milliseconds (an integer): sums of integers are exact, so a
    histogram's `_sum` moved from the log to the tallies neither grows nor shrinks."""

    output_field = IntegerField()

    def __init__(self, end, start):
        super().__init__(Seconds(end, start))

    def as_sql(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="CAST(ROUND(%(expressions)s * 1000) AS BIGINT)", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template="CAST(ROUND(%(expressions)s * 1000) AS INTEGER)", **extra)


def durations(attempts, kind: str):
    """(attempts annotated with `d` (seconds) and `ms`, the time field a window applies to).
    "wait": the job's first attempt (numbers run on across retries: a retry's wait is not
    counted), started after the job was queued; "run": an ended attempt's start to end."""
    if kind == "wait":
        attempts = attempts.filter(number=1, queued_at__isnull=False, started_at__gte=F("queued_at"))
        return attempts.annotate(d=Seconds("started_at", "queued_at"), ms=Millis("started_at", "queued_at")), "started_at"
    attempts = attempts.filter(finished_at__isnull=False)
    return attempts.annotate(d=Seconds("finished_at", "started_at"), ms=Millis("finished_at", "started_at")), "finished_at"
