"""The layout's size rules (issue 11), measured rather than remembered.

- No module over MODULE_LINES lines unless its docstring or its leading comment says why, in
  a line that starts "Long because:".
- No function over FUNCTION_LINES lines (decorators and docstring included). A function
  that must be longer goes on LONG_FUNCTIONS with its reason; keep that list tiny.
- No docstring over DOCSTRING_WORDS words: what and why in a few lines.

Every package is measured: the product's (queue_app, comfy_app, remixstudio) and bench/.
Tests and migrations are left out: a test reads as one story, a migration is generated.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queue_app", "comfy_app", "remixstudio", "bench")
MODULE_LINES = 400
FUNCTION_LINES = 60
DOCSTRING_WORDS = 150
REASON = "Long because:"

# "path::function": why it is longer than FUNCTION_LINES. Empty today.
LONG_FUNCTIONS: dict[str, str] = {}


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py") if "migrations" not in path.parts)


def relative(path: Path, root: Path = ROOT) -> str:
    return path.relative_to(root).as_posix()


def says_why_it_is_long(source: str) -> bool:
    """The reason stands in the module docstring or in the comments above the first line of code."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    leading = []
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        leading.append(line.lstrip("# "))
    return any(line.strip().startswith(REASON) for line in docstring.splitlines() + leading)


def long_modules(paths, root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MODULE_LINES and not says_why_it_is_long(source):
            found.append(f"{relative(path, root)}: {lines} lines")
    return found


def function_lengths(source: str):
    """(qualified name, lines) of every function and method, nested ones included."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    start = min([child.lineno] + [decorator.lineno for decorator in child.decorator_list])
                    yield name, child.end_lineno - start + 1
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def long_functions(paths, root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        for name, lines in function_lengths(path.read_text()):
            key = f"{relative(path, root)}::{name}"
            if lines > FUNCTION_LINES and key not in LONG_FUNCTIONS:
                found.append(f"{key}: {lines} lines")
    return found


def long_docstrings(paths, root: Path = ROOT) -> list[str]:
    """Docstrings (module, class, function) over DOCSTRING_WORDS words."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in [tree, *ast.walk(tree)]:
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            words = len((ast.get_docstring(node) or "").split())
            if words > DOCSTRING_WORDS:
                found.append(f"{relative(path, root)}::{getattr(node, 'name', '<module>')}: {words} words")
    return sorted(set(found))


def test_every_module_is_short_or_says_why_it_is_long():
    assert long_modules(modules()) == []


def test_no_function_outside_tests_and_migrations_is_over_sixty_lines():
    assert long_functions(modules()) == []


def test_no_docstring_is_over_150_words():
    assert long_docstrings(modules()) == []


def test_the_allow_list_names_only_functions_that_exist_and_are_long():
    lengths = {f"{relative(path)}::{name}": lines for path in modules() for name, lines in function_lengths(path.read_text())}
    assert {key: lengths.get(key, 0) > FUNCTION_LINES for key in LONG_FUNCTIONS} == dict.fromkeys(LONG_FUNCTIONS, True)


# The measure itself, on made-up modules: it must be able to fail.


def test_a_long_module_without_a_reason_is_reported(tmp_path):
    module = tmp_path / "queue_app" / "big.py"
    module.parent.mkdir()
    module.write_text('"""Big."""\n' + "x = 1\n" * MODULE_LINES)
    assert long_modules([module], tmp_path) == [f"queue_app/big.py: {MODULE_LINES + 1} lines"]
    module.write_text('"""Big.\n\nLong because: one table, read as one."""\n' + "x = 1\n" * MODULE_LINES)
    assert long_modules([module], tmp_path) == []
    module.write_text("# A table.\n# Long because: one table, read as one.\n\n" + "x = 1\n" * MODULE_LINES)
    assert long_modules([module], tmp_path) == []


@pytest.mark.parametrize("package", ["queue_app/engine", "queue_app/web", "bench"])
def test_a_long_function_is_reported_in_every_package(tmp_path, package):
    module = tmp_path / package / "step.py"
    module.parent.mkdir(parents=True)
    body = "".join(f"    x{n} = {n}\n" for n in range(FUNCTION_LINES))
    module.write_text(f"class Loop:\n    @staticmethod\n    def step():\n{body.replace('    ', '        ')}")
    assert long_functions([module], tmp_path) == [f"{package}/step.py::Loop.step: {FUNCTION_LINES + 2} lines"]


def test_a_long_docstring_is_reported_and_a_short_one_is_not(tmp_path):
    for package, words in (("queue_app/engine", DOCSTRING_WORDS + 1), ("queue_app/web", DOCSTRING_WORDS)):
        module = tmp_path / package / "step.py"
        module.parent.mkdir(parents=True)
        module.write_text('"""' + "word " * words + '"""\n\n\ndef f():\n    """Short."""\n')
    found = long_docstrings(sorted(tmp_path.rglob("*.py")), tmp_path)
    assert found == [f"queue_app/engine/step.py::<module>: {DOCSTRING_WORDS + 1} words"]


def test_migrations_are_left_out(tmp_path):
    assert all("migrations" not in path.parts for path in modules())
    assert any(path.parts[-2:] == ("engine", "transitions.py") for path in modules())
