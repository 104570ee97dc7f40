"""The generated CRD on a real apiserver: defaults, schema and CEL rejections, subresources."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from api_cases import BAD_SPECS, BadSpec
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from training_jobs import manifest

from torchkube.api import GROUP, PLURAL, VERSION, TrainingJob

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]


def create(api: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )
    return created


@pytest.fixture
def custom(api_client: Any, crd: dict[str, Any]) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def test_minimal_job_is_defaulted_like_the_models(custom: Any, namespace: str) -> None:
    stored = create(custom, namespace, manifest("minimal", {}))
    expected = TrainingJob.model_validate(manifest("minimal", {})).spec.to_wire()
    assert stored["spec"] == expected


def test_full_example_is_accepted(custom: Any, namespace: str) -> None:
    spec = {
        "replicas": {"min": 2, "max": 8, "desired": 4},
        "nprocPerNode": 8,
        "resources": {"gpus": 8, "requests": {"cpu": "32", "memory": "256Gi"}},
        "checkpoint": {"size": "200Gi", "intervalSeconds": 600},
        "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "scheduling": {"tolerations": [{"key": "k", "operator": "Exists"}]},
    }
    stored = create(custom, namespace, manifest("full", spec))
    assert stored["spec"]["env"][0]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert stored["spec"]["checkpoint"]["size"] == "200Gi"


def test_tensor_parallel_jobs_are_accepted(custom: Any, namespace: str) -> None:
    """The CEL rules on tensor parallelism let through what the models let through."""
    example = yaml.safe_load((ROOT / "examples" / "llama-tensor-parallel.yaml").read_text())
    stored = create(custom, namespace, example)
    assert stored["spec"]["trainer"]["parallelism"] == {"tensor": 8}
    trainer = {"model": "llama-tiny", "strategy": "hsdp", "parallelism": {"tensor": 4}}
    spec = {"nprocPerNode": "auto", "resources": {"gpus": 8}, "trainer": trainer}
    create(custom, namespace, manifest("tp-auto", spec))


def test_hsdp_shard_sizes_that_fit_every_size_are_accepted(custom: Any, namespace: str) -> None:
    """The CEL rule's short form lets through what the model's range walk lets through."""
    for name, spec in {
        "hsdp-range": {"nprocPerNode": 4, "replicas": {"min": 1, "max": 4}, "shard": 2},
        "hsdp-fixed": {"nprocPerNode": 2, "replicas": {"min": 2, "max": 2}, "shard": 4},
        "hsdp-cpu": {"nprocPerNode": "cpu", "replicas": {"min": 1, "max": 3}, "shard": 4},
    }.items():
        shard = spec.pop("shard")
        body = manifest(name, {**spec, "trainer": {"strategy": "hsdp", "hsdpShardSize": shard}})
        TrainingJob.model_validate(body)
        create(custom, namespace, body)


def test_live_recovery_jobs_that_it_supports_are_accepted(custom: Any, namespace: str) -> None:
    """The CEL rule lets through one process per pod, as an integer or auto on CPU."""
    for name, nproc in {"live-one": 1, "live-auto": "auto"}.items():
        body = manifest(name, {"nprocPerNode": nproc, "failurePolicy": {"recovery": "live"}})
        TrainingJob.model_validate(body)
        create(custom, namespace, body)


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_bad_spec_is_rejected_by_the_apiserver(custom: Any, namespace: str, case: BadSpec) -> None:
    with pytest.raises(ApiException) as raised:
        create(custom, namespace, manifest(case.name, case.spec))
    assert raised.value.status in (400, 422), raised.value.body
    body = raised.value.body
    assert case.field in body, body
    assert case.allowed in body, body


def test_immutable_fields_are_refused_and_replicas_are_not(custom: Any, namespace: str) -> None:
    create(custom, namespace, manifest("imm", {"replicas": {"min": 1, "max": 4}}))
    with pytest.raises(ApiException) as raised:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "imm", {"spec": {"image": "other:1"}}
        )
    assert "image is immutable" in raised.value.body
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "imm", {"spec": {"replicas": {"desired": 2}}}
    )
    assert patched["spec"]["replicas"]["desired"] == 2


@pytest.mark.parametrize(
    "change",
    [
        {"learningRate": 0.5},  # a field with a default, changed
        {"parallelism": {"tensor": 2}},  # a nested object's field
        {"weightsPath": "/weights"},  # a field without a default, set
        {"dataPath": None},  # one that was set, unset
    ],
    ids=["changed", "nested", "set", "unset"],
)
def test_the_trainer_is_refused_every_change_and_the_rest_of_the_job_is_not(
    custom: Any, namespace: str, change: dict[str, Any]
) -> None:
    """The trainer's immutability is a rule per field and one on which fields are set
    (``spec.immutable_fields``): no change of it gets through, a replicas change does."""
    name = f"trainer-{next(iter(change)).lower()}"
    spec = {"replicas": {"min": 1, "max": 4}, "trainer": {"dataPath": "/data/train.bin"}}
    create(custom, namespace, manifest(name, spec))
    with pytest.raises(ApiException) as raised:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"trainer": change}}
        )
    assert raised.value.status == 422 and "trainer is immutable" in raised.value.body
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"replicas": {"desired": 2}}}
    )
    assert patched["spec"]["trainer"]["dataPath"] == "/data/train.bin"


def test_who_runs_a_job_is_chosen_once(custom: Any, namespace: str) -> None:
    """spec.managedBy is neither changed, set, nor removed after creation: a job MultiKueue
    dispatched must not start a second time here, nor one running here be sent away."""
    create(custom, namespace, manifest("here", {}))
    dispatched = {"managedBy": "kueue.x-k8s.io/multikueue"}
    create(custom, namespace, manifest("sent", dispatched))
    for name, change in (
        ("here", {"spec": dispatched}),
        ("sent", {"spec": {"managedBy": None}}),
        ("sent", {"spec": {"managedBy": "torchkube.io/trainingjob-controller"}}),
    ):
        with pytest.raises(ApiException) as raised:
            custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, change)
        assert "spec.managedBy is immutable" in raised.value.body, (name, change)


def test_scale_subresource_moves_desired_within_bounds(custom: Any, namespace: str) -> None:
    create(custom, namespace, manifest("scl", {"replicas": {"min": 1, "max": 4}}))
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "scl", {"spec": {"replicas": 3}}
    )
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scl")
    assert stored["spec"]["replicas"]["desired"] == 3
    with pytest.raises(ApiException) as raised:
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, "scl", {"spec": {"replicas": 9}}
        )
    assert "must lie between" in raised.value.body


def test_a_job_with_spares_is_not_scaled_below_max(custom: Any, namespace: str) -> None:
    """Spares stand by beyond max: kubectl scale below max is refused with what to do."""
    create(custom, namespace, manifest("spr", {"replicas": {"min": 1, "max": 4, "spares": 1}}))
    with pytest.raises(ApiException) as raised:
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, "spr", {"spec": {"replicas": 2}}
        )
    assert "set spares to 0 before scaling below max" in raised.value.body


def test_status_is_a_subresource(custom: Any, namespace: str) -> None:
    create(custom, namespace, manifest("st", {}))
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "st", {"status": {"phase": "Running"}}
    )
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "st")
    assert "status" not in stored or stored["status"].get("phase") != "Running"
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "st", {"status": {"phase": "Running", "restarts": 2}}
    )
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "st")
    assert stored["status"]["phase"] == "Running" and stored["status"]["restarts"] == 2
