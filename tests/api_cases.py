"""Bad TrainingJobs, each rejected both by the pydantic models and by the apiserver's CRD schema.

Every case names a fragment of the field path and a fragment of what is allowed; both error
texts must contain both, so the two validation layers cannot drift apart silently.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BadSpec:
    id: str
    spec: dict[str, Any]
    field: str
    allowed: str
    name: str = "bad-job"
    extra: dict[str, Any] = field(default_factory=dict)


BAD_SPECS = [
    BadSpec(
        "managed-by-another-controller",
        {"managedBy": "example.com/our-own-controller"},
        "managedBy",
        "kueue.x-k8s.io/multikueue",
    ),
    BadSpec(
        "topology-level-not-a-label-key",
        {"scheduling": {"topology": {"level": "the rack"}}},
        "topology.level",
        "should match",
    ),
    BadSpec(
        "topology-mode-unknown",
        {"scheduling": {"topology": {"level": "example.com/rack", "mode": "strict"}}},
        "topology.mode",
        "preferred",
    ),
    BadSpec("min-above-max", {"replicas": {"min": 3, "max": 2}}, "replicas", "less than or equal"),
    BadSpec(
        "desired-outside-bounds",
        {"replicas": {"min": 1, "max": 4, "desired": 8}},
        "replicas",
        "must lie between",
    ),
    BadSpec(
        "claim-and-size",
        {"checkpoint": {"claimName": "ckpt", "size": "10Gi"}},
        "checkpoint",
        "not both",
    ),
    BadSpec(
        "no-checkpoint-cadence",
        {"checkpoint": {"intervalSteps": 0}},
        "checkpoint",
        "intervalSeconds",
    ),
    BadSpec(
        "exit-code-both-lists",
        {"failurePolicy": {"permanentExitCodes": [3], "retryableExitCodes": [3, 137]}},
        "failurePolicy",
        "both permanent and retryable",
    ),
    BadSpec(
        "backoff-reversed",
        {"failurePolicy": {"backoff": {"initialSeconds": 60, "maxSeconds": 10}}},
        "backoff",
        "must not exceed",
    ),
    BadSpec(
        "port-clash",
        {"rendezvous": {"port": 9400}, "metrics": {"port": 9400}},
        "spec",
        "must differ",
    ),
    BadSpec(
        "live-hsdp",
        {"failurePolicy": {"recovery": "live"}, "trainer": {"strategy": "hsdp"}},
        "spec",
        "recovery live supports strategy ddp or fsdp",
    ),
    BadSpec(
        "live-last-port",
        {"failurePolicy": {"recovery": "live"}, "rendezvous": {"port": 65535}},
        "spec",
        "Lighthouse takes the next port",
    ),
    BadSpec("recovery-word", {"failurePolicy": {"recovery": "hot"}}, "recovery", "live"),
    BadSpec("nproc-word", {"nprocPerNode": "many"}, "nprocPerNode", "auto, cpu, gpu"),
    BadSpec("nproc-zero", {"nprocPerNode": 0}, "nprocPerNode", "positive integer"),
    BadSpec("negative-gpus", {"resources": {"gpus": -1}}, "resources.gpus", "0"),
    BadSpec(
        "bad-quantity",
        {"checkpoint": {"size": "ten gigs"}},
        "checkpoint.size",
        "Kubernetes quantity",
    ),
    BadSpec(
        "unknown-clean-policy",
        {"runPolicy": {"cleanPodPolicy": "Sometimes"}},
        "runPolicy.cleanPodPolicy",
        "Running",
    ),
    BadSpec("relative-mount", {"checkpoint": {"mountPath": "ckpt"}}, "checkpoint.mountPath", "^/"),
    BadSpec("bad-env-name", {"env": [{"name": "1BAD", "value": "x"}]}, "env", "name"),
    BadSpec("unknown-field", {"replica": 3}, "replica", "unknown field"),
    BadSpec("rendezvous-port-low", {"rendezvous": {"port": 80}}, "rendezvous.port", "1024"),
    BadSpec("name-too-long", {}, "metadata.name", "at most 40 characters", name="a" + "b" * 45),
    BadSpec("keep-one-checkpoint", {"checkpoint": {"keep": 1}}, "checkpoint.keep", "2"),
    BadSpec(
        "spares-below-max",
        {"replicas": {"min": 1, "max": 4, "desired": 2, "spares": 1}},
        "replicas",
        "spares to 0 before scaling below max",
    ),
    BadSpec(
        "straggler-slowdown-one",
        {"failurePolicy": {"stragglerSlowdown": 1.0}},
        "failurePolicy.stragglerSlowdown",
        "1.1",
    ),
    BadSpec(
        "negative-hang-timeout",
        {"failurePolicy": {"hangTimeoutSeconds": -5}},
        "failurePolicy.hangTimeoutSeconds",
        "0",
    ),
    BadSpec(
        "data-two-sources",
        {"data": {"source": {"path": "/corpus", "url": "https://example.org/a.txt"}}},
        "data",
        "exactly one of path, claim, url, huggingFace",
    ),
    BadSpec("data-no-source", {"data": {"source": {}}}, "data", "exactly one of"),
    BadSpec(
        "data-and-data-path",
        {"data": {"source": {"path": "/corpus"}}, "trainer": {"dataPath": "/x/train.bin"}},
        "data",
        "not both",
    ),
    BadSpec(
        "data-eval-without-split",
        {
            "data": {"source": {"path": "/corpus"}, "valFraction": 0},
            "trainer": {"evalIntervalSteps": 5},
        },
        "data",
        "valFraction above 0",
    ),
    BadSpec(
        "data-url-scheme",
        {"data": {"source": {"url": "ftp://example.org/a.txt"}}},
        "data.source.url",
        "https?",
    ),
    BadSpec(
        "tensor-not-dividing-nproc",
        {"nprocPerNode": 4, "trainer": {"model": "llama-tiny", "parallelism": {"tensor": 8}}},
        "trainer.parallelism.tensor",
        "must divide nprocPerNode",
    ),
    BadSpec(
        "tensor-without-process-count",
        {"trainer": {"model": "llama-tiny", "parallelism": {"tensor": 2}}},
        "trainer.parallelism.tensor",
        "must divide nprocPerNode",
    ),
    BadSpec(
        "tensor-not-dividing-gpus",
        {
            "nprocPerNode": 8,
            "resources": {"gpus": 4},
            "trainer": {"model": "llama-tiny", "parallelism": {"tensor": 8}},
        },
        "trainer.parallelism.tensor",
        "must divide resources.gpus",
    ),
    BadSpec(
        "tensor-with-gpt",
        {"nprocPerNode": 2, "trainer": {"model": "gpt2", "parallelism": {"tensor": 2}}},
        "parallelism.tensor",
        "needs a Llama-family model",
    ),
    BadSpec(
        "tensor-with-zero1",
        {
            "nprocPerNode": 2,
            "trainer": {"model": "llama-tiny", "strategy": "zero1", "parallelism": {"tensor": 2}},
        },
        "parallelism.tensor",
        "not zero1",
    ),
    BadSpec(
        "seq-len-split-unevenly",
        {
            "nprocPerNode": 4,
            "trainer": {"model": "llama-tiny", "seqLen": 1026, "parallelism": {"tensor": 4}},
        },
        "seqLen",
        "splits every sequence over the tensor ranks",
    ),
    BadSpec(
        "hsdp-shard-not-dividing-some-world-size",
        {
            "nprocPerNode": 2,
            "replicas": {"min": 1, "max": 4},
            "trainer": {"strategy": "hsdp", "hsdpShardSize": 4},
        },
        "trainer.hsdpShardSize",
        "must divide the data-parallel size at every size in the elastic range",
    ),
    BadSpec(
        "hsdp-shard-not-dividing-the-fixed-size",
        {
            "resources": {"gpus": 4},
            "replicas": {"min": 3, "max": 3},
            "trainer": {
                "model": "llama-tiny",
                "strategy": "hsdp",
                "hsdpShardSize": 4,
                "parallelism": {"tensor": 2},
            },
        },
        "trainer.hsdpShardSize",
        "must divide the data-parallel size at every size in the elastic range",
    ),
    BadSpec("tensor-zero", {"trainer": {"parallelism": {"tensor": 0}}}, "tensor", "1"),
    BadSpec(
        "weights-for-gpt",
        {"trainer": {"model": "gpt2", "weightsPath": "/checkpoints/llama"}},
        "weightsPath",
        "needs a Llama-family model",
    ),
    BadSpec(
        "export-for-gpt",
        {"trainer": {"model": "gpt2", "exportFormat": "hf"}},
        "exportFormat",
        "needs a Llama-family model",
    ),
    BadSpec(
        "llama-with-dropout",
        {"trainer": {"model": "llama-tiny", "dropout": 0.1}},
        "dropout",
        "must be 0 for a Llama-family model",
    ),
    BadSpec(
        "unknown-activation-checkpointing",
        {"trainer": {"activationCheckpointing": "some"}},
        "activationCheckpointing",
        "selective",
    ),
]
