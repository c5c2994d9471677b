"""common_prefix (engine/slots.py): what slot choice, the prompt caches and cache reuse count as
a prompt's reusable prefix; its slice-halving search must give the plain token loop's answer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.engine.slots import common_prefix


def naive(a, b) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


tokens = st.lists(st.integers(0, 3), max_size=90)


@settings(max_examples=400, deadline=None)
@given(tokens, tokens, st.booleans(), st.booleans())
def test_it_is_the_length_of_the_longest_common_prefix(head, tail, a_list, b_list):
    a, b = head + tail, head + tail[::-1] + [1]
    a, b = (list(a) if a_list else tuple(a)), (list(b) if b_list else tuple(b))
    assert common_prefix(a, b) == naive(a, b) == common_prefix(b, a)


def test_edges():
    assert common_prefix([], (1,)) == 0 and common_prefix((1, 2), [1, 2, 3]) == 2
    assert common_prefix([5] * 100, (5,) * 99 + (4,)) == 99 and common_prefix((1,), (2,)) == 0
