"""No import circles in the read and page packages: a circle there meant a late import to
dodge it, and a module that could not be read (or tested) without its partner."""

import grimp
import pytest

CHECKED = ("queue_app.selectors", "queue_app.web", "queue_app.services", "queue_app.providers")


def import_circles(graph, package_prefixes) -> list[list[str]]:
    """The strongly connected groups of more than one module among those under the prefixes."""
    modules = sorted(m for m in graph.modules if m.startswith(package_prefixes))
    inside = set(modules)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module) & inside:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                circles.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return circles


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("queue_app")


def test_selectors_web_services_and_providers_import_without_circles(graph):
    assert import_circles(graph, CHECKED) == []


def test_the_circle_finder_finds_a_circle():
    graph = grimp.ImportGraph()
    for module in ("queue_app.web.a", "queue_app.web.b", "queue_app.web.c"):
        graph.add_module(module)
    graph.add_import(importer="queue_app.web.a", imported="queue_app.web.b")
    graph.add_import(importer="queue_app.web.b", imported="queue_app.web.a")
    graph.add_import(importer="queue_app.web.c", imported="queue_app.web.a")
    assert import_circles(graph, CHECKED) == [["queue_app.web.a", "queue_app.web.b"]]
