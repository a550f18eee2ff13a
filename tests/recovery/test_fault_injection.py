"""MFC_SIM_FAULT reaches the rank, node and attempt it names, and nothing else (recovery/fault_injection.py)."""

from __future__ import annotations

import pytest

from megatron_fixedcode.recovery.fault_injection import START_UP, FaultInjection


def test_a_fault_belongs_to_its_rank_or_node_and_attempt(monkeypatch):
    spec = "rank_killed;1;6 rank_hung;@node2;9;1 rank_killed_starting;@node1;0;1 rank_killed_saving;0;8;0"
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert FaultInjection(1, 0, spec).faults == {6: "rank_killed"}
    assert FaultInjection(3, 1, spec).faults == {9: "rank_hung"}  # node2's first rank, attempt 1 only
    assert FaultInjection(0, 0, spec).faults == {8: "rank_killed_saving"}
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert FaultInjection(3, 1, spec).faults == {}  # not the node's first rank
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert FaultInjection(0, 1, spec).faults == {START_UP: "rank_killed_starting"}


def test_no_variable_no_fault_and_an_unknown_kind_is_named(monkeypatch):
    monkeypatch.delenv("MFC_SIM_FAULT", raising=False)
    quiet = FaultInjection(0, 0)
    assert quiet.faults == {}
    quiet.at_start(), quiet.before_step(1), quiet.at_save(1)  # nothing happens
    with pytest.raises(ValueError, match="unknown fault 'rank_exploded'"):
        FaultInjection(0, 0, "rank_exploded;0;1")
