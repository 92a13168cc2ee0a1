"""Node-level allocation: best fit, whole nodes for big jobs, spread, strict placement, release."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.sim.partition import Partition


def test_consolidate_best_fit_picks_tightest_node():
    p = Partition("p", "v100", 3, 8)
    a = p.allocate(6, "consolidate", False)  # node 0 -> 2 free
    b = p.allocate(3, "consolidate", False)  # node 1 -> 5 free
    c = p.allocate(2, "consolidate", False)  # best fit: node 0 (2 free), not node 1 (5) or node 2 (8)
    assert [n for n, _ in c] == [a[0][0]]
    assert b[0][0] != a[0][0]
    p.check()


def test_multi_node_job_takes_whole_nodes_first():
    p = Partition("p", "v100", 4, 8)
    p.allocate(4, "consolidate", False)
    alloc = p.allocate(20, "consolidate", False)  # 2 whole nodes + 4 on the half-used node
    assert sorted(c for _, c in alloc) == [4, 8, 8]
    assert len(alloc) == p.ideal_nodes(20)
    p.check()


def test_fragmented_fallback_and_strict_placement():
    p = Partition("p", "v100", 2, 8)
    p.allocate(5, "consolidate", False)
    p.allocate(5, "consolidate", False)  # 3 + 3 free on two nodes
    assert not p.fits(6, strict=True)
    alloc = p.allocate(6, "consolidate", False)
    assert sorted(c for _, c in alloc) == [3, 3]
    assert p.total_free == 0
    p.check()


def test_spread_uses_many_nodes():
    p = Partition("p", "v100", 4, 8)
    alloc = p.allocate(4, "spread", False)
    assert len(alloc) == 4 and all(c == 1 for _, c in alloc)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.booleans(), st.sampled_from(["consolidate", "spread"])), max_size=40))
def test_allocate_release_keeps_books(ops):
    p = Partition("p", "v100", 5, 4)
    held = []
    for gpus, release, placement in ops:
        if release and held:
            p.release(held.pop(0))
        else:
            alloc = p.allocate(gpus, placement, False)
            if alloc is None:
                assert gpus > p.total_free
            else:
                assert sum(c for _, c in alloc) == gpus
                held.append(alloc)
        p.check()
    assert p.total - p.total_free == sum(c for a in held for _, c in a)
