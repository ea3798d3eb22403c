"""The shape of the code, checked from its imports and definitions (issue 26; docs/architecture.md).

- no import cycle between product modules (imports deferred into functions count; ``TYPE_CHECKING``
  ones do not, they never run);
- no lower layer importing an upper one (``LAYERS``);
- at most ``PROXY_TOP_MODULES`` modules directly in ``proxy/``;
- no class over ``MAX_CLASS_LINES`` lines and no function over ``MAX_FUNCTION_LINES``.

Product code is every package the project installs (pyproject's ``packages.find``), migrations left
out (generated).
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROXY_TOP_MODULES = 12
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 40

#: Layers, lowest first: a module may import its own layer and those below it, never one above.
#: The longest matching prefix names a module's layer.
LAYERS: dict[str, int] = {
    "proxy.guard": 0,           # the sans-IO core
    "infra": 1, "config.env": 1, "config.celery": 1, "config.settings": 1, "config": 1,
    "tenants": 2,
    "audit": 3,
    "billing": 4,
    "alerts": 5,
    "proxy.simulator": 6,
    "proxy.upstreams": 6, "proxy.policy": 6, "proxy.telemetry": 6,
    "proxy.routing": 6,
    "proxy.relay": 7,
    "proxy.edge": 8,
    "proxy": 8,
    "proxy.management": 9,
    "api": 9,
    "config.asgi": 10, "config.urls": 10,
}


def packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]


def modules() -> dict[str, Path]:
    found = {}
    for package in packages():
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    return skipped


def _imported(name: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = name.split(".") if known[name].name == "__init__.py" else name.split(".")[:-1]
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            yield target


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
                graph[name].update(_imported(name, node, known))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(module: str) -> int:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} is in no layer of LAYERS"
    return LAYERS[max(prefixes, key=len)]


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_no_lower_layer_imports_an_upper_one() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets if layer(a) < layer(b))
    assert upward == []


def test_the_guard_core_imports_no_io() -> None:
    io = ("django", "channels", "httpx", "asyncio", "daphne", "twisted", "redis", "psycopg")
    offending = []
    for name, path in modules().items():
        if not name.startswith("proxy.guard"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offending += [f"{name}: {n}" for n in names if n.split(".")[0] in io]
    assert offending == []


def test_proxy_has_few_top_level_modules() -> None:
    top = sorted(p.name for p in (ROOT / "proxy").glob("*.py"))
    assert len(top) <= PROXY_TOP_MODULES, top


def _sizes(kind: type | tuple[type, ...]) -> Iterator[tuple[int, str]]:
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind):
                assert isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                yield lines, f"{name}.{node.name} ({lines} lines)"


def test_no_class_is_too_long() -> None:
    assert [where for lines, where in _sizes(ast.ClassDef) if lines > MAX_CLASS_LINES] == []


def test_no_function_is_too_long() -> None:
    long = [where for lines, where in _sizes((ast.FunctionDef, ast.AsyncFunctionDef)) if lines > MAX_FUNCTION_LINES]
    assert long == []


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    """The checks can fail: a made-up graph with a cycle and a guard module importing the relay."""
    graph = {"proxy.guard.x": {"proxy.relay.loop"}, "proxy.relay.loop": {"proxy.guard.x"}}
    assert cycles(graph) == [["proxy.guard.x", "proxy.relay.loop"]]
    assert layer("proxy.guard.x") < layer("proxy.relay.loop")


#: Where memberships may be filtered by user outside ``tenants.scoping``, and why it is not scoping.
MEMBERSHIP_BY_USER_ALLOWED = {
    "tenants.selectors.memberships_for_user": "a person's own memberships, for their /account/ key page",
    "tenants.management.commands.member.Command._add": "the operator's command names one user in one tenant",
    "tenants.management.commands.limits._member": "the operator's command names one user in one tenant",
    "tenants.services.member_reinvite": "not scoping: is the account another tenant's too (then no new link)",
}
_USER_LOOKUP = ("user", "user_id", "user__", "memberships__user")


def membership_scoping(name: str, tree: ast.AST) -> Iterator[str]:
    """``module.function`` of every query in ``tree`` that filters memberships (or tenants through
    them) by user, or that names ``STAFF_ROLES``: the work of ``tenants.scoping`` alone."""

    def visit(node: ast.AST, where: str) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            inner = f"{where}.{child.name}" if isinstance(child, ast.ClassDef | ast.FunctionDef
                                                          | ast.AsyncFunctionDef) else where
            if isinstance(child, ast.Attribute) and child.attr == "STAFF_ROLES":
                yield inner
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and child.func.attr in ("filter", "exclude", "get"):
                lookups = [k.arg or "" for k in child.keywords]
                on_memberships = "Membership" in ast.unparse(child.func.value)
                by_user = [k for k in lookups if k == "user" or k.startswith(_USER_LOOKUP)]
                if any(k.startswith("memberships__user") for k in lookups) or (on_memberships and by_user):
                    yield inner
            yield from visit(child, inner)

    yield from visit(tree, name)


def test_only_tenants_scoping_computes_membership_scoping() -> None:
    """Which tenants a person sees or manages is computed behind one door (issue 26 item 9)."""
    found = sorted({where for name, path in modules().items() if name not in ("tenants.scoping", "tenants.models")
                    for where in membership_scoping(name, ast.parse(path.read_text()))})
    assert [w for w in found if w not in MEMBERSHIP_BY_USER_ALLOWED] == []
    assert set(found) == set(MEMBERSHIP_BY_USER_ALLOWED), "an allowed entry no longer exists: drop it"


def test_the_scoping_check_sees_a_second_door() -> None:
    """The check can fail: a made-up admin computing roles itself, and a tenants-by-member query."""
    source = ("def roles(request):\n"
              "    return Membership.objects.filter(user_id=request.user.pk, role__in=Membership.STAFF_ROLES)\n"
              "class A:\n"
              "    def tenants(self, user):\n"
              "        return Tenant.objects.filter(memberships__user=user)\n")
    assert sorted(set(membership_scoping("x", ast.parse(source)))) == ["x.A.tenants", "x.roles"]
