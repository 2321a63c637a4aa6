"""The consumer-group state machine (kafka_gateway.groups.group): the table of
allowed transitions is Kafka's, every move outside it raises and leaves the group
as it was."""

from __future__ import annotations

import itertools

import pytest

from kafka_gateway.groups.group import TRANSITIONS, Group, GroupState, IllegalTransition

EMPTY, DEAD, STABLE = GroupState.EMPTY, GroupState.DEAD, GroupState.STABLE
PREPARING = GroupState.PREPARING_REBALANCE
COMPLETING = GroupState.COMPLETING_REBALANCE

# Kafka 3.4's GroupMetadata.scala, each state's validPreviousStates, as written there.
VALID_PREVIOUS_STATES = {
    PREPARING: {STABLE, COMPLETING, EMPTY},
    COMPLETING: {PREPARING},
    STABLE: {COMPLETING},
    DEAD: {STABLE, PREPARING, COMPLETING, EMPTY, DEAD},
    EMPTY: {PREPARING},
}


def test_the_table_is_kafkas():
    assert set(TRANSITIONS) == set(GroupState)
    ours = {(before, after) for before, targets in TRANSITIONS.items() for after in targets}
    kafkas = {(before, after) for after, befores in VALID_PREVIOUS_STATES.items()
              for before in befores}
    assert ours == kafkas


@pytest.mark.parametrize(("before", "after"), list(itertools.product(GroupState, GroupState)),
                         ids=lambda s: s.value)
def test_move(before: GroupState, after: GroupState):
    group = Group("g", state=before, state_since_ms=1)
    if before in VALID_PREVIOUS_STATES[after]:
        group.move(after, 2)
        assert (group.state, group.state_since_ms) == (after, 2)
    else:
        with pytest.raises(IllegalTransition, match=f"{before.value} -> {after.value}"):
            group.move(after, 2)
        assert (group.state, group.state_since_ms) == (before, 1)
