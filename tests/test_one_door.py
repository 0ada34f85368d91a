"""One door into the state machine (issue 26), measured on the source rather than
remembered: an attempt's outcome is written only by the transitions (engine/transitions.py)
that change its job in the same transaction, and error classes and attempt outcomes are
the enums (ErrorClass, JobAttempt.Outcome), never string literals."""

import ast
from pathlib import Path

import pytest

from queue_app.models import ErrorClass
from queue_app.providers import base

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queue_app", "comfy_app")
# What ends or changes an attempt: only the transitions call these (attempts.py defines them).
ATTEMPT_WRITERS = {
    "attempt_finish",
    "attempt_detached",
    "attempts_close_open",
    "attempts_to_remote",
    "attempts_interrupt",
}
DOOR = {"queue_app/engine/transitions.py", "queue_app/engine/attempts.py"}
ENUM_KEYWORDS = ("error_class", "outcome")


def product_modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts)


def called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def attempt_writes_outside_the_door(paths, root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        name = path.relative_to(root).as_posix()
        if name in DOOR:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and called_name(node) in ATTEMPT_WRITERS:
                found.append(f"{name}:{node.lineno} {called_name(node)}")
    return found


def literal_classes(paths, root: Path = ROOT) -> list[str]:
    """`error_class=` / `outcome=` keywords (and "error_class" dict keys) given a non-empty
    string literal, anywhere in their value (`"a" if x else "b"` too)."""
    found = []
    for path in paths:
        name = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.keyword) and node.arg in ENUM_KEYWORDS:
                values.append(node.value)
            elif isinstance(node, ast.Dict):
                values += [
                    v
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value in ENUM_KEYWORDS
                ]
            for value in values:
                for inner in ast.walk(value):
                    if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and inner.value:
                        found.append(f"{name}:{inner.lineno} {inner.value!r}")
    return found


def test_only_the_transitions_end_or_change_an_attempt():
    assert attempt_writes_outside_the_door(product_modules()) == []


def test_error_classes_and_outcomes_are_the_enums_in_product_code():
    assert literal_classes(product_modules()) == []


def test_every_error_class_a_provider_adapter_raises_is_one_the_queue_knows():
    # providers/ sits below the models (it imports none), so its errors carry the values.
    classes = {cls.error_class for cls in vars(base).values() if isinstance(cls, type) and hasattr(cls, "error_class")}
    assert classes and classes <= set(ErrorClass.values)


# The measures themselves, on made-up modules: they must be able to fail.


@pytest.mark.parametrize(
    "source, reported",
    [
        ('job_fail(job.id, token, reason="x", error_class="local")\n', ["'local'"]),
        ('f(outcome="timeout" if late else ErrorClass.PERMANENT)\n', ["'timeout'"]),
        ('fields = {"error_class": "transient"}\n', ["'transient'"]),
        ('job_fail(job.id, token, reason="x", error_class=ErrorClass.LOCAL)\nupdate(error_class="")\n', []),
    ],
)
def test_a_string_literal_as_an_error_class_is_reported(tmp_path, source, reported):
    module = tmp_path / "queue_app" / "worker" / "step.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert [line.split(" ", 1)[1] for line in literal_classes([module], tmp_path)] == reported


def test_an_attempt_write_outside_the_transitions_is_reported(tmp_path):
    module = tmp_path / "queue_app" / "worker" / "step.py"
    module.parent.mkdir(parents=True)
    module.write_text("from queue_app.engine import attempts\nattempts.attempt_finish(1, 'lost')\n")
    assert attempt_writes_outside_the_door([module], tmp_path) == ["queue_app/worker/step.py:2 attempt_finish"]
    door = tmp_path / "queue_app" / "engine" / "transitions.py"
    door.parent.mkdir(parents=True)
    door.write_text("attempt_finish(1, Outcome.LOST)\n")
    assert attempt_writes_outside_the_door([door], tmp_path) == []
