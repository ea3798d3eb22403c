"""``Ctx.may_name``: the prefix check of declared tool names, linear in their total length (issue 24
item 2), answers exactly as the old set of every prefix of every name did."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.dialects.base import Ctx
from proxy.guard.turn import ToolSpec


def _old_may_name(names: list[str], ident: str) -> bool:
    """The behaviour before: membership in every prefix (of length >= 1) of every name."""
    return ident in frozenset(n[:i] for n in names for i in range(1, len(n) + 1))


def _ctx(names: list[str]) -> Ctx:
    return Ctx.of(tuple(ToolSpec(name=n, parameters={}) for n in names))


ALPHABET = st.sampled_from("ab_.-é")
NAMES = st.lists(st.text(ALPHABET, max_size=8), max_size=8)


@given(NAMES, st.text(ALPHABET, max_size=9))
def test_it_answers_as_the_set_of_every_prefix_did(names: list[str], ident: str) -> None:
    assert _ctx(names).may_name(ident) == _old_may_name(names, ident)


@given(NAMES)
def test_every_prefix_of_every_name_and_nothing_one_longer(names: list[str]) -> None:
    ctx = _ctx(names)
    for name in names:
        for i in range(1, len(name) + 1):
            assert ctx.may_name(name[:i])
        assert not ctx.may_name(name + "\x00") or _old_may_name(names, name + "\x00")


def test_its_size_is_the_names_own_not_every_prefix() -> None:
    """Forty names of 10,000 characters: the review's +1.2 GB came from 400,000 prefix strings; the context
    now keeps the names only (one reference each), and still answers for any of their prefixes."""
    names = [f"t{i:02d}_" + "x" * 9_996 for i in range(40)]
    ctx = _ctx(names)
    assert sum(map(len, ctx.ordered)) == sum(map(len, names)) and len(ctx.ordered) == 40
    assert ctx.may_name(names[7][:5000]) and ctx.may_name(names[39]) and not ctx.may_name(names[0] + "x")
    assert not hasattr(ctx, "prefixes")
