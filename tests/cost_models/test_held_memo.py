"""The cost models' memo: computed once per (held object, key), never handed to another object."""

from cost_models.memo import HeldMemo


class _Profile:
    pass


def test_a_value_is_computed_once_per_object_and_key() -> None:
    calls: list[int] = []
    memo: HeldMemo[int] = HeldMemo(limit=8)
    profile, other = _Profile(), _Profile()
    assert memo.get(profile, (1,), lambda: calls.append(1) or 10) == 10
    assert memo.get(profile, (1,), lambda: calls.append(2) or 20) == 10  # a hit
    assert memo.get(other, (1,), lambda: calls.append(3) or 30) == 30  # another object: its own entry
    assert memo.get(profile, (2,), lambda: calls.append(4) or 40) == 40
    assert calls == [1, 3, 4]


def test_the_memo_empties_itself_when_full() -> None:
    memo: HeldMemo[int] = HeldMemo(limit=2)
    profile = _Profile()
    for key in range(3):
        memo.get(profile, (key,), lambda: 0)
    calls: list[int] = []
    memo.get(profile, (0,), lambda: calls.append(0) or 0)  # dropped when the third entry came in
    assert calls == [0]
