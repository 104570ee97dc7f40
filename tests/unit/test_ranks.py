"""The slotted node descriptor the launcher's agents rank by (torchkube/elastic/ranks.py):
ordered by slot before address, kept whole through the rendezvous state's pickle, named in
torch's logs as torch names it."""

import pickle

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

from torchkube.elastic.ranks import NO_SLOT, SlottedNode


def test_nodes_sort_by_slot_then_as_torch_sorts_them() -> None:
    nodes = [
        SlottedNode("10.0.0.1", 9, 0, 2),
        SlottedNode("10.0.0.9", 1, 0, 0),
        SlottedNode("10.0.0.5", 5, 0, 1),
        SlottedNode("10.0.0.3", 7, 1, NO_SLOT),
        SlottedNode("10.0.0.2", 7, 0, NO_SLOT),
    ]
    assert [(n.slot, n.addr) for n in sorted(nodes)] == [
        (NO_SLOT, "10.0.0.2"),
        (NO_SLOT, "10.0.0.3"),
        (0, "10.0.0.9"),
        (1, "10.0.0.5"),
        (2, "10.0.0.1"),
    ]
    assert nodes[1] < nodes[0] and nodes[0] > nodes[2] and nodes[2] >= nodes[2]
    plain = rdzv._NodeDesc("10.0.0.0", 1, 0)  # sorts as a node without a slot, either way
    assert sorted([nodes[0], plain, nodes[3]]) == [plain, nodes[3], nodes[0]]
    assert plain < nodes[0] and nodes[0] > plain and not nodes[0] < plain


def test_a_node_survives_the_state_pickle_and_keeps_torch_name() -> None:
    state = rdzv._RendezvousState()
    node = SlottedNode("10.0.0.1", 42, 3, 7)
    state.participants = {node: 0}
    back = pickle.loads(pickle.dumps(state))
    assert list(back.participants) == [node] and next(iter(back.participants)).slot == 7
    assert repr(node) == repr(rdzv._NodeDesc("10.0.0.1", 42, 3)) == "10.0.0.1_42_3"
    assert node != SlottedNode("10.0.0.1", 42, 3, 8)
