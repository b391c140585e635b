"""Hot statements the ORM writes once per process and shape, then sent with each call's values.

Building a statement through the ORM (cloning querysets, resolving lookups, compiling) costs more
Python than sending it: the decision's compare-and-set took 1.3 ms to write and a fraction of that
to run. A statement on the hot path is written once by its own ORM code, with a marker in place
of each value that changes between calls (a pk, a time, a message); the markers' positions among
the parameters are noted, and each later call sends the same SQL with its values put there. What
is not a marker (the statuses a transition table allows, which fields are NULL, a flag) is part
of the shape, so it belongs to the key the caller gives.

A value reaches the statement as the caller passes it: give what the ORM would send (a pk, not a
model; an aware datetime). With checking on (the test suite's conftest), every call also writes
the statement with its real values through the ORM and raises StatementDrift when the two differ,
so each shape the suite runs is compared with the ORM's own statement.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, router
from django.db.models import AutoField, Model, QuerySet, sql
from django.db.models.query import MAX_GET_RESULTS, ModelIterable, get_related_populators
from django.db.transaction import TransactionManagementError
from psycopg import Binary as _Binary  # how the PostgreSQL backend hands psycopg bytes

# Each call compared with the ORM's own statement: the test suite turns it on (tests/conftest.py,
# for its own processes and the workers and servers it starts).
CHECKING = os.environ.get("APPROVALS_CHECK_STATEMENTS") == "1"

Build = Callable[[Mapping[str, Any]], tuple[str, Sequence[Any]]]
BuildQuerySet = Callable[[Mapping[str, Any]], QuerySet]


class StatementDrift(AssertionError):
    """A cached statement is not what the ORM writes for the same values: a marker was
    transformed, or something the caller left out of the key changes the statement."""


@dataclass(frozen=True)
class _Written:
    sql: str
    params: tuple[Any, ...]
    # For each parameter that carries a value: its position, the value's name, and the type the
    # ORM gave it when that is a subclass of the value's own (psycopg's Int4 for an integer
    # column, which sets the parameter's type in the prepared statement), else None.
    slots: tuple[tuple[int, str, type | None], ...]

    def filled(self, values: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The statement with these values. EmptyResultSet for an integer no column of its type
        holds (a pk from a URL): objects() then reads nothing, as the ORM's equality lookup does;
        statement() refuses it."""
        params = list(self.params)
        for position, name, wrap in self.slots:
            value = values[name]
            if isinstance(value, int):
                bits = _INTEGER_BITS.get(wrap.__name__, 64) if wrap is not None else 64
                if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                    raise EmptyResultSet(f"{name} {value} is out of its column's range")
            params[position] = value if wrap is None else wrap(value)
        return self.sql, tuple(params)


# The integer types psycopg binds a column's value as, by size (64 bits for any other).
_INTEGER_BITS = {"Int2": 16, "Int4": 32, "Int8": 64}


_written: dict[Hashable, _Written] = {}
_lock = threading.Lock()

# Markers: values of the right type that no caller sends, each told apart from the others. Kept
# within a 32-bit integer's positive range (the ORM leaves a lookup out of range out of the SQL).
_INT_MARKER = 2_000_000_000
_TIME_MARKER = datetime(2000, 1, 1, tzinfo=UTC)


def _marker(name: str, value: Any, n: int) -> Any:
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name}: a flag or NULL is part of a statement's shape, not a value")
    if isinstance(value, int):
        return _INT_MARKER + n
    if isinstance(value, str):
        return f"\x1fstatement-value-{n}\x1f"
    if isinstance(value, datetime):
        return _TIME_MARKER + timedelta(microseconds=n + 1)
    if isinstance(value, bytes):
        return f"\x1fstatement-value-{n}\x1f".encode()
    raise TypeError(f"{name}: no marker for a {type(value).__name__}")


def _slot(param: Any, names: Mapping[Any, str]) -> tuple[str, type | None] | None:
    """The value a parameter carries (its name, and the ORM's type for it), or None."""
    # Bytes reach psycopg wrapped (Binary(value), whose value is its .obj).
    wrapped = getattr(param, "obj", None) if isinstance(param, _Binary) else None
    try:
        name = names.get(param if wrapped is None else wrapped)
    except TypeError:  # an unhashable parameter (an adapter of a JSON value) carries none
        return None
    if name is None:
        return None
    return name, None if type(param) in (int, str, datetime, bytes) else type(param)


def _comparable(param: Any) -> Any:
    """A parameter as _check compares it: a wrapper of bytes by the bytes it holds."""
    return (type(param), param.obj) if isinstance(param, _Binary) else param


def _write(build: Build, values: Mapping[str, Any]) -> _Written:
    markers = {name: _marker(name, value, n) for n, (name, value) in enumerate(values.items())}
    sql, params = build(markers)
    params = tuple(params)
    # Markers are told apart by value: no int marker equals a string or a time.
    names = {marker: name for name, marker in markers.items()}
    slots = tuple(
        (position, *found)
        for position, param in enumerate(params)
        if (found := _slot(param, names)) is not None
    )
    missing = set(values) - {name for _, name, _ in slots}
    if missing:
        raise StatementDrift(
            f"values {sorted(missing)} are not parameters of the statement as the ORM wrote it"
        )
    return _Written(sql, params, slots)


def _once(key: Hashable, write: Callable[[], Any]) -> Any:
    written = _written.get(key)
    if written is None:
        with _lock:
            written = _written.get(key)
            if written is None:
                written = _written[key] = write()
    return written


def statement(
    key: Hashable, build: Build, values: Mapping[str, Any]
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters build(values) returns, written by build once per key.

    build: the statement's own ORM code, returning (sql, params) for the values it is given.
    key: everything else the statement depends on (with the caller's name, so two callers never
    share one). values: int, str, bytes or aware datetime each (None and bool belong in the key).
    """
    try:
        sql, params = _once(key, lambda: _write(build, values)).filled(values)
    except EmptyResultSet as error:
        raise ValueError(f"statement {key!r}: {error}") from None
    if CHECKING:
        _check(key, sql, params, build(values))
    return sql, params


@dataclass(frozen=True)
class _Read:
    written: _Written
    # The compiler that wrote it: which columns make which model (select_related), and how
    # each column's value is read (the backend's and the fields' converters). Its connection is
    # the writing thread's: each read takes a copy with its own thread's.
    compiler: Any
    db: str
    locks: bool


def _check(key: Hashable, sql: str, params: tuple, expected: tuple[str, Sequence[Any]]) -> None:
    expected_sql, expected_params = expected[0], tuple(expected[1])
    # Equal values of other types (5 and Int4(5)) bind differently: the types count too.
    if (sql, [_comparable(p) for p in params], [type(p) for p in params]) != (
        expected_sql,
        [_comparable(p) for p in expected_params],
        [type(p) for p in expected_params],
    ):
        raise StatementDrift(
            f"statement {key!r} drifted from the ORM's:\n{sql}\n{params}\n"
            f"against\n{expected_sql}\n{expected_params}"
        )


def _sql_of(queryset: QuerySet) -> tuple[str, Sequence[Any]]:
    return queryset.query.get_compiler(queryset.db).as_sql()


def _write_read(build: BuildQuerySet, values: Mapping[str, Any]) -> _Read:
    compiler = None

    def written(markers):
        nonlocal compiler
        queryset = build(markers)
        if (
            queryset._iterable_class is not ModelIterable
            or queryset._prefetch_related_lookups
            or queryset._known_related_objects
            or queryset.query.extra_select
        ):
            raise TypeError(
                "only a queryset of model objects, without prefetches or extra(), is read once"
            )
        compiler = queryset.query.get_compiler(queryset.db)
        return compiler.as_sql()

    return _Read(
        _write(written, values), compiler, compiler.using, bool(compiler.query.select_for_update)
    )


def objects(key: Hashable, build: BuildQuerySet, values: Mapping[str, Any]) -> list[Model]:
    """The model objects build(values) would give (build: the read's own queryset code, for the
    values it is given), its SQL written once per key (see statement()). Select_related rows
    come with it, as the ORM gives them. An integer value no column holds reads nothing, as an
    equality lookup (exact, or in with that one value) of the ORM does: give such values only to
    those. A read that locks (select_for_update) raises TransactionManagementError outside a
    transaction, as the ORM does."""
    read = _once(key, lambda: _write_read(build, values))
    connection = connections[read.db]
    if read.locks and connection.get_autocommit():
        raise TransactionManagementError(
            "select_for_update cannot be used outside of a transaction."
        )
    try:
        sql, params = read.written.filled(values)
    except EmptyResultSet:
        return []
    if CHECKING:
        _check(key, sql, params, _sql_of(build(values)))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return list(_model_objects(read, rows, connection))


def get(key: Hashable, build: BuildQuerySet, values: Mapping[str, Any]) -> Model:
    """QuerySet.get() of build(values), through objects(): the one object it reads, else the
    model's DoesNotExist or MultipleObjectsReturned."""

    def limited(values):
        queryset = build(values).order_by()
        if not queryset.query.select_for_update or (
            connections[queryset.db].features.supports_select_for_update_with_limit
        ):
            queryset = queryset[:MAX_GET_RESULTS]
        return queryset

    found = objects(("get", key), limited, values)
    if len(found) == 1:
        return found[0]
    model = build(values).model if not found else type(found[0])
    if not found:
        raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
    raise model.MultipleObjectsReturned(f"get() returned more than one {model._meta.object_name}")


def _model_objects(read: _Read, rows: list[tuple], connection):
    """Rows to model objects, as Django's ModelIterable makes them, read through this thread's
    connection."""
    made = _reading(read, connection)
    rows = made.compiler.apply_converters(rows, made.converters) if made.converters else rows
    start, end = made.start, made.end
    for row in rows:
        obj = made.model.from_db(read.db, made.init_list, row[start:end])
        for populator in made.related_populators:
            populator.populate(row, obj)
        for name, position in made.annotations:
            setattr(obj, name, row[position])
        yield obj


@dataclass(frozen=True)
class _Reading:
    """How one read's rows become model objects through one connection: its compiler's copy,
    the columns of its model, the select_related populators and the converters of each
    column, which do not change for a connection."""

    read: _Read
    compiler: Any
    model: type[Model]
    start: int
    end: int
    init_list: list[str]
    related_populators: list[Any]
    annotations: list[tuple[str, int]]
    converters: dict


def _reading(read: _Read, connection) -> _Reading:
    # Per connection (each thread has its own), per read: a read lives as long as the process.
    kept = connection.__dict__.setdefault("_statement_readings", {})
    made = kept.get(id(read))
    if made is not None and made.read is read:
        return made
    compiler = copy.copy(read.compiler)
    compiler.connection = connection
    select, klass_info = compiler.select, compiler.klass_info
    fields = [column[0] for column in select[0 : compiler.col_count]]
    if compiler.has_composite_fields(fields):
        raise TypeError("a read of composite fields is not written once")
    start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
    made = kept[id(read)] = _Reading(
        read=read,
        compiler=compiler,
        model=klass_info["model"],
        start=start,
        end=end,
        init_list=[column[0].target.attname for column in select[start:end]],
        related_populators=get_related_populators(klass_info, select, read.db),
        annotations=list(compiler.annotation_col_map.items()),
        converters=compiler.get_converters(fields),
    )
    return made


def bulk_create(key: Hashable, objs: Sequence[Model]) -> list[Model]:
    """Model.objects.bulk_create(objs): on PostgreSQL one new object's INSERT ... RETURNING is
    written once per key and shape (which of its fields are NULL, its flags), and its pk read
    back into it; several objects, an object with a pk, or another database, bulk_create
    itself. As bulk_create, it sends no model signals. Each field's value is sent as the object
    holds it (a field that sets its own value on save, auto_now, is refused)."""
    objs = list(objs)
    if not objs:
        return []
    model = type(objs[0])
    manager = model._default_manager
    using = router.db_for_write(model, instance=objs[0])
    if len(objs) > 1 or connections[using].vendor != "postgresql" or objs[0]._is_pk_set():
        return manager.db_manager(using).bulk_create(objs)
    (obj,) = objs
    opts = model._meta
    written, params = _insert(("bulk_create", key), obj, using=using, returning=True)
    with connections[using].cursor() as cursor:
        cursor.execute(written, params)
        row = cursor.fetchone()
    for result, field in zip(row, opts.db_returning_fields, strict=True):
        setattr(obj, field.attname, result)
    obj._state.adding = False
    obj._state.db = using
    return objs


def insert(key: Hashable, obj: Model, *, using: str) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of one new object with its pk already set, without RETURNING, written once
    per key and shape as bulk_create's is: for a caller that sends it inside a statement of its
    own (audit.changes.update_holding_head). Nothing is sent here."""
    if not obj._is_pk_set():
        raise ValueError(f"statement {key!r}: the {type(obj).__name__} has no pk to insert")
    return _insert(("insert", key), obj, using=using, returning=False)


def _insert(key: Hashable, obj: Model, *, using: str, returning: bool):
    model = type(obj)
    obj._prepare_related_fields_for_save(operation_name=key[0])
    opts = model._meta
    fields = [
        f
        for f in opts.concrete_fields
        if not f.generated and (not isinstance(f, AutoField) or not returning)
    ]
    values: dict[str, Any] = {}
    shape: list[tuple[str, Any]] = []
    for field in fields:
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            raise TypeError(f"{field.name} sets its own value on save: not written once")
        value = getattr(obj, field.attname)
        if value is None or isinstance(value, bool):
            shape.append((field.attname, value))
        else:
            values[field.attname] = value

    def build(given):
        query = sql.InsertQuery(model)
        query.insert_values(fields, [model(**dict(shape), **given)])
        compiler = query.get_compiler(using=using)
        if returning:
            compiler.returning_fields = opts.db_returning_fields
        ((written, params),) = compiler.as_sql()
        return written, params

    return statement((*key, model, tuple(shape)), build, values)


def returning(model: type[Model], *, using: str) -> str:
    """Every column of the model, for a RETURNING clause whose rows row_object() reads."""
    quote = connections[using].ops.quote_name
    return ", ".join(quote(field.column) for field in model._meta.concrete_fields)


def row_object(model: type[Model], row: Sequence[Any], *, using: str) -> Model:
    """The model object of a row of returning()'s columns, each read as the ORM reads it (the
    backend's and the field's converters: SQLite's times, JSON), without a queryset."""
    connection = connections[using]
    # Per connection (each thread has its own), per model: the converters do not change.
    cached = connection.__dict__.setdefault("_statement_converters", {})
    columns = cached.get(model)
    if columns is None:
        columns = cached[model] = [
            (
                field.attname,
                connection.ops.get_db_converters(col := field.get_col(model._meta.db_table))
                + field.get_db_converters(connection),
                col,
            )
            for field in model._meta.concrete_fields
        ]
    values = []
    for (_, converters, col), value in zip(columns, row, strict=True):
        for converter in converters:
            value = converter(value, col, connection)
        values.append(value)
    return model.from_db(using, [name for name, _, _ in columns], values)


def forget() -> None:
    """Drop every written statement (a test that changes what the ORM writes)."""
    with _lock:
        _written.clear()
