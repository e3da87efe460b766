"""The package's structure: imports go one way.

Every module under ``dataflow/`` is parsed (not imported), and every import it makes, at module
level or inside a function, is an edge of the import graph. The graph must have no cycle, and the
statistics module must import nothing from ``dataflow.parallel`` (dataflows tell it what it shows).
"""
import ast
import pathlib

import dataflow

ROOT = pathlib.Path(dataflow.__file__).resolve().parent


def _module_name(path):
    parts = ("dataflow",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name, path, known):
    """The modules of the package that module ``name`` (at ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # "from X import y" imports X.y when y is a module, and X otherwise
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _graph():
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _find_cycle(graph):
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_the_parser_sees_module_and_function_local_imports():
    graph = _graph()
    assert "dataflow.parallel.mapper" in graph["dataflow.parallel.runners"]
    # MapData imports the parallel dataflows inside a function: that edge is seen too
    assert any(m.startswith("dataflow.parallel.") for m in graph["dataflow.common"])


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_statistics_import_nothing_from_parallel():
    imported = _graph()["dataflow.stats"]
    assert not [m for m in imported if m.startswith("dataflow.parallel")], imported
