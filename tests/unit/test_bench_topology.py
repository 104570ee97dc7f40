"""bench.topology_placement's pure parts: the layout's labels, the "all in one domain" check
that the share of packed jobs is counted with, the sizes, and the jobs and Kueue objects a
trial makes. Nothing runs a cluster here."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench import topology_placement as tp
from bench.kube import BENCH_LABEL, PodTimes
from torchkube.api import TrainingJob


def test_the_layout_labels_every_node_with_its_block_and_a_rack_unique_across_blocks() -> None:
    pools = tp.layout(blocks=2, racks=2, nodes=3)
    labels = tp.node_labels(pools)
    assert len(labels) == 12
    assert labels["b1-r0-2"][tp.BLOCK] == "b1"
    assert labels["b1-r0-2"][tp.RACK] == "b1-r0"
    assert labels["b1-r0-2"][BENCH_LABEL] == tp.NODE_GROUP
    racks = {node[tp.RACK] for node in labels.values()}
    assert len(racks) == 4, "a rack's value names one rack of one block"
    assert {pool.failure_domain for pool in pools} == {"b0", "b1"}, "one kwok process a block"


def test_workers_are_in_one_domain_only_when_every_node_shares_the_levels_value() -> None:
    labels = tp.node_labels(tp.layout(blocks=2, racks=2, nodes=2))
    same_rack = ["b0-r1-0", "b0-r1-1"]
    same_block = ["b0-r0-0", "b0-r1-0"]
    assert tp.in_one_domain(same_rack, labels, tp.RACK)
    assert not tp.in_one_domain(same_block, labels, tp.RACK)
    assert tp.in_one_domain(same_block, labels, tp.BLOCK)
    assert tp.domains_of(["b1-r0-0", *same_block], labels, tp.BLOCK) == ["b0", "b1"]


def test_a_node_without_the_label_never_makes_a_job_look_packed() -> None:
    labels = tp.node_labels(tp.layout(blocks=1, racks=1, nodes=2))
    assert not tp.in_one_domain(["b0-r0-0", "elsewhere"], labels, tp.RACK)
    assert not tp.in_one_domain(["elsewhere", "other"], labels, tp.RACK)
    assert not tp.in_one_domain([], labels, tp.RACK), "no worker placed is not packed"


def test_sizes_name_their_level_and_say_whether_one_domain_has_room() -> None:
    four, sixteen, all_of_it, quarters = tp.parse_sizes(
        "4:rack:required,16:block:required,64:block:preferred,64:block:required:2"
    )
    assert four.key == tp.RACK and four.label == "4 workers, required rack"
    assert four.fits(racks=4, nodes=4) and sixteen.fits(racks=4, nodes=4)
    assert not all_of_it.fits(racks=4, nodes=4), "64 whole nodes: the cluster, no block"
    assert quarters.label == "64 workers of 2 GPUs, required block"
    assert quarters.fits(racks=4, nodes=4), "four a node: one block of 16 nodes holds 64"
    assert tp.trial_job("j", quarters, tp.KUEUE)["spec"]["resources"]["gpus"] == 2
    for wrong in ("4:zone:required", "4:rack:required:3", "4:rack:required:2:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            tp.parse_sizes(wrong)


def test_only_the_asking_ways_carry_a_topology_and_only_kueues_a_queue() -> None:
    size = tp.Size(4, "rack", "required")
    for way in tp.WAYS:
        body = tp.trial_job("job", size, way, pending_timeout=5)
        TrainingJob.model_validate(body)
        scheduling = body["spec"]["scheduling"]
        asks = way in (tp.WITHOUT, tp.KUEUE)
        assert (scheduling.get("topology") == {"level": tp.RACK, "mode": "required"}) == asks
        queued = body["metadata"].get("labels", {}).get(tp.QUEUE_LABEL) == tp.QUEUE
        assert queued == way.startswith("Kueue")
        assert scheduling["pendingTimeoutSeconds"] == 5
        assert body["spec"]["resources"]["gpus"] == tp.GPUS_PER_NODE, "a whole node a worker"


def test_a_holder_is_a_queued_one_worker_job_pinned_to_its_node() -> None:
    body = tp.holding_job("b0-r1-0")
    TrainingJob.model_validate(body)
    assert body["spec"]["scheduling"]["nodeSelector"][tp.HOST] == "b0-r1-0"
    assert body["spec"]["replicas"] == {"min": 1, "max": 1}
    assert body["metadata"]["labels"][tp.QUEUE_LABEL] == tp.QUEUE


def test_kueues_topology_has_the_three_levels_and_the_queue_holds_every_gpu() -> None:
    objects = dict(tp.kueue_objects(nodes=64))
    levels = [level["nodeLabel"] for level in objects["topologies"]["spec"]["levels"]]
    assert levels == [tp.BLOCK, tp.RACK, tp.HOST]
    assert objects["resourceflavors"]["spec"]["topologyName"] == tp.TOPOLOGY
    [group] = objects["clusterqueues"]["spec"]["resourceGroups"]
    quota = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quota["nvidia.com/gpu"] == "512"
    assert set(group["coveredResources"]) == set(quota)


def _pod(
    uid: str, node: str, running: float | None = 1.0, deleted: float | None = None
) -> PodTimes:
    return PodTimes(uid, uid, {}, 0.0, node=node, running=running, deleted=deleted)


def test_a_lost_node_is_replaced_once_a_new_worker_runs_and_none_is_left_on_it() -> None:
    before = {"a": "n1", "b": "n2", "c": "n3"}
    old = {uid: _pod(uid, node) for uid, node in before.items()}
    # the lost pod still live on the deleted node: not whole yet
    assert tp.replaced(old, before, "n1", 3) is None
    gone = {**old, "a": _pod("a", "n1", deleted=2.0)}
    pending = {**gone, "d": _pod("d", "n4", running=None)}
    assert tp.replaced(pending, before, "n1", 3) is None
    whole = {**gone, "d": _pod("d", "n4", running=3.5)}
    assert tp.replaced(whole, before, "n1", 3) == 3.5
    # a new pod on the lost node (it came back) does not count as the job whole elsewhere
    back = {**gone, "d": _pod("d", "n1", running=3.5)}
    assert tp.replaced(back, before, "n1", 3) is None
