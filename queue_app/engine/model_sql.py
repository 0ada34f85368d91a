"""Plain statements written from a model's own fields, for the hot path (engine/hot_sql.py
says why it does without Django's statement building there).

`select` / `insert` / `insert_many` / `update` take the table, the columns, each value as
the field prepares it (`get_db_prep_save` / `get_db_prep_value`) and each row as the field
converts it (the converters of `field.get_col()`) from the model, so no column list is
typed twice. They take equality filters and plain values only; anything more goes through
the ORM. `fetch`, `shape`, `converters_of` and `converted` are the parts hot_sql's own
reads build on.
"""

from functools import cache

from django.conf import settings
from django.db import connection

# From its third use on a connection, a hot statement runs prepared. A statement whose
# shape changes with its rows (a VALUES list of n rows) is rarely met three times and
# never prepared, which would cost it a round trip of its own.
PREPARE_FROM_USE = 3


def cursor():
    """A cursor for the hot path's own statements. On PostgreSQL its parameters are bound
    at the server, and a statement run again is prepared: parsed and planned once per
    connection, not on every handover (the planning was over a third of a handover's time
    in the database). The ORM's statements are not touched: Django binds them in the
    client, and psycopg prepares none of those. `PREPARE_HOT_STATEMENTS=0` turns this off
    (for a pooler that cannot keep prepared statements, such as PgBouncer in transaction
    mode before 1.21)."""
    if connection.vendor != "postgresql" or not settings.PREPARE_HOT_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:  # Django's default: never
        raw.prepare_threshold = PREPARE_FROM_USE - 1  # psycopg prepares past this many uses
    return connection._prepare_cursor(_prepared_cursor_class()(raw))


@cache
def _prepared_cursor_class():
    # Django's PostgreSQL module (and psycopg) load only with PostgreSQL in use.
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        def execute(self, query, params=None, *, prepare=None, binary=None):
            super().execute(query, params, prepare=prepare, binary=binary)
            if self._query is None:
                # psycopg keeps the query it sent only when it was not prepared; Django's
                # query log (DEBUG, the statement-count tests) reads it from there.
                self._query = self._sent
            return self

        def _convert_query(self, query, params=None):
            self._sent = super()._convert_query(query, params)
            return self._sent

    return PreparedCursor


def fetch(sql: str, params: list, *, prepared: bool = True) -> list[tuple]:
    """The rows of one statement; `prepared=False` for one whose plan depends on its
    values (a prepared statement is planned once for any values after a few runs)."""
    with cursor() if prepared else connection.cursor() as statement:
        statement.execute(sql, params)
        return statement.fetchall()


def converters_of(model, alias: str) -> list[tuple]:
    """Per concrete field of `model`, its column and the converters Django applies to its
    value (the database's, then the field's), as a query of the ORM would."""
    converters = []
    for field in model._meta.concrete_fields:
        column = field.get_col(alias)  # a foreign key's: typed as the key it points to
        converters.append((column, connection.ops.get_db_converters(column) + column.get_db_converters(connection)))
    return converters


def converted(values, converters) -> list:
    out = []
    for value, (column, field_converters) in zip(values, converters, strict=True):
        for convert in field_converters:
            value = convert(value, column, connection)
        out.append(value)
    return out


@cache
def shape(model, vendor: str) -> tuple[str, str, list, list]:
    """(table, its columns, their attnames, their converters) for `model` on this database."""
    fields = model._meta.concrete_fields
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(f"{table}.{quote(f.column)}" for f in fields)
    return table, columns, [f.attname for f in fields], converters_of(model, model._meta.db_table)


def compiled(model, expression) -> tuple[str, list]:
    """A Django expression as SQL and parameters for this database (Now() differs)."""
    query = model.objects.all().query
    sql, params = query.get_compiler(connection=connection).compile(expression.resolve_expression(query))
    return sql, list(params)


def where_sql(model, where: dict) -> tuple[str, list]:
    quote, sql, params = connection.ops.quote_name, [], []
    for name, value in where.items():
        field = model._meta.get_field(name)
        if value is None:  # as the ORM reads filter(name=None)
            sql.append(f"{quote(field.column)} IS NULL")
            continue
        sql.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_value(value, connection))
    return " AND ".join(sql), params


def select(model, *, lock: str = "", **where) -> list:
    """model.objects.filter(**where) as instances, `lock` ("FOR UPDATE", …) on PostgreSQL."""
    table, columns, names, converters = shape(model, connection.vendor)
    condition, params = where_sql(model, where)
    sql = f"SELECT {columns} FROM {table} WHERE {condition}"
    if lock and connection.vendor == "postgresql":
        sql += f" {lock}"
    return [model.from_db(connection.alias, names, converted(row, converters)) for row in fetch(sql, params)]


def update(model, where: dict, values: dict) -> int:
    """model.objects.filter(**where).update(**values): rows changed. Values that are
    expressions (F("attempts") - 1) go through the ORM."""
    if any(hasattr(value, "resolve_expression") for value in values.values()):
        return model.objects.filter(**where).update(**values)
    quote = connection.ops.quote_name
    assignments, params = [], []
    for name, value in values.items():
        field = model._meta.get_field(name)
        assignments.append(f"{quote(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    condition, where_params = where_sql(model, where)
    with cursor() as statement:
        statement.execute(
            f"UPDATE {quote(model._meta.db_table)} SET {', '.join(assignments)} WHERE {condition}", params + where_params
        )
        return statement.rowcount


def insert(obj, *, computed: dict | None = None):
    """obj.save(force_insert=True) for a model with an automatic id, without its save():
    the fields' defaults and auto_now values are applied as save() would (pre_save).
    `computed`: {field name: (SQL, parameters)} for values the database works out in the
    same statement; they are read back into `obj`."""
    model = type(obj)
    quote = connection.ops.quote_name
    computed = computed or {}
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    placeholders, values = [], []
    for f in fields:
        if f.name in computed:
            sql, params = computed[f.name]
            placeholders.append(f"({sql})")
            values += params
        else:
            placeholders.append("%s")
            values.append(f.get_db_prep_save(f.pre_save(obj, add=True), connection))
    pk = model._meta.pk
    back = [pk, *(model._meta.get_field(name) for name in computed)]
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(placeholders)}) RETURNING {', '.join(quote(f.column) for f in back)}"
    )
    [row] = fetch(sql, values)
    for field, value in zip(back, row, strict=True):
        setattr(obj, field.attname, field.to_python(value))
    obj._state.adding, obj._state.db = False, connection.alias
    return obj


def insert_many(objs: list) -> None:
    """Model.objects.bulk_create(objs) in one statement, for rows nobody reads back by id
    (their ids stay unset in hand)."""
    if not objs:
        return
    model = type(objs[0])
    quote = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    row = f"({', '.join(['%s'] * len(fields))})"
    head = f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) VALUES "
    with cursor() as statement:
        for start in range(0, len(objs), INSERT_CHUNK):
            chunk = objs[start : start + INSERT_CHUNK]
            params = [f.get_db_prep_save(f.pre_save(obj, add=True), connection) for obj in chunk for f in fields]
            statement.execute(head + ", ".join([row] * len(chunk)), params)


INSERT_CHUNK = 500  # rows a statement: well within both databases' limits on parameters
