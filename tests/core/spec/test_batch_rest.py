"""The batch's back-off when its drafts are never verified (``draftwise.spec.batch_rest``)."""

from __future__ import annotations

from draftwise.spec.batch_rest import BatchRest


def idle(rest: BatchRest, rows: int, steps: int) -> None:
    """``steps`` steps of ``rows`` rows that asked for drafts and verified none."""
    for _ in range(steps):
        rest.observe(rows, False)


def rest_length(rest: BatchRest, rows: int) -> int:
    """Steps of ``rows`` rows that rest from now on, in a row."""
    n = 0
    while rest.resting(rows):
        n += 1
        assert n < 1000
    return n


def test_idle_steps_start_a_rest_that_backs_off_to_the_longest() -> None:
    rest = BatchRest(base=3, backoff=2.0, longest=10)
    idle(rest, 8, 2)
    assert rest_length(rest, 8) == 0  # two idle steps: not yet
    idle(rest, 8, 1)
    assert rest_length(rest, 8) == 3
    lengths = []
    for _ in range(3):
        idle(rest, 8, 3)
        lengths.append(rest_length(rest, 8))
    assert lengths == [6, 10, 10]
    assert rest.summary() == {"enabled": True, "rests": 4, "rested_steps": 29}


def test_a_verified_draft_ends_the_backing_off() -> None:
    rest = BatchRest(base=2, backoff=2.0, longest=16)
    for _ in range(3):
        idle(rest, 4, 2)
        rest_length(rest, 4)
    idle(rest, 4, 1)
    rest.observe(4, True)  # verified: the idle run and the back-off start over
    idle(rest, 4, 1)
    assert rest_length(rest, 4) == 0
    idle(rest, 4, 1)
    assert rest_length(rest, 4) == 2


def test_a_change_of_batch_size_ends_a_rest() -> None:
    rest = BatchRest(base=2, backoff=2.0, longest=16)
    idle(rest, 8, 2)
    assert rest.resting(8)
    assert not rest.resting(7)  # a request finished: decide again
    assert not rest.resting(8)
    idle(rest, 8, 2)
    assert rest_length(rest, 8) == 2  # and the back-off started over


def test_idle_steps_count_at_one_batch_size() -> None:
    rest = BatchRest(base=3, backoff=2.0, longest=16)
    idle(rest, 8, 2)
    idle(rest, 7, 2)
    assert rest_length(rest, 7) == 0
    idle(rest, 7, 1)
    assert rest_length(rest, 7) == 3


def test_reset_ends_the_rest_and_the_back_off() -> None:
    rest = BatchRest(base=2, backoff=2.0, longest=16)
    idle(rest, 1, 2)
    rest_length(rest, 1)
    idle(rest, 1, 2)
    assert rest.resting(1)
    rest.reset()  # a new request came
    assert not rest.resting(1)
    idle(rest, 1, 2)
    assert rest_length(rest, 1) == 2


def test_disabled_never_rests() -> None:
    rest = BatchRest(base=1, backoff=2.0, longest=4, enabled=False)
    idle(rest, 8, 50)
    assert rest_length(rest, 8) == 0 and rest.summary()["rests"] == 0
