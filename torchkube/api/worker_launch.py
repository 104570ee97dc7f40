"""How a worker of a TrainingJob is started: its launcher command line and the environment
of :mod:`torchkube.api.contract`, both pure functions of the job.

The operator's pod builder, ``torchkube run`` and the benchmarks start every worker from
these, so a worker on loopback is told what a worker in a pod is told and none of them needs
the operator to build one.
"""

import json

from torchkube.api import labels as lbl
from torchkube.api.contract import LIVE_MIN_REPLICA_GROUPS, Env
from torchkube.api.trainingjob import TrainingJob

TORCHRUN_MONITOR_INTERVAL = 0.1
"""How often an agent looks at its workers at the least (torchrun's ``--monitor-interval``),
torch's own default; a worker process that ends wakes it at once
(``torchkube.elastic.torchrun``). Each look also asks how many agents wait to join, a read
served from the state cached for ``torchkube.elastic.torchrun.poll_seconds``, so a faster
look adds no load on the store."""
KEEP_ALIVE_MAX_ATTEMPTS = 3
SHUTDOWN_MARGIN_SECONDS = 2


def live(job: TrainingJob) -> bool:
    return job.spec.failure_policy.recovery == "live"


def fewest_training_workers(job: TrainingJob) -> int:
    """How few running workers still train: a torchrun round needs ``replicas.min``; in live
    recovery each pod is a replica group and a quorum of ``LIVE_MIN_REPLICA_GROUPS`` trains."""
    return LIVE_MIN_REPLICA_GROUPS if live(job) else job.spec.replicas.min


def rendezvous_endpoint(job: TrainingJob) -> str:
    """DNS name of the store pod through the job's headless Service."""
    return f"{lbl.RENDEZVOUS_HOSTNAME}.{job.name}.{job.namespace}.svc:{job.spec.rendezvous.port}"


def lighthouse_port(job: TrainingJob) -> int:
    """recovery live: the Lighthouse's port, the one after the store's."""
    return job.spec.rendezvous.port + 1


def lighthouse_service_name(job: TrainingJob) -> str:
    """recovery live: the headless Service of the Lighthouse's own pod."""
    return f"{job.name}-{lbl.ROLE_LIGHTHOUSE}"


def lighthouse_endpoint(job: TrainingJob) -> str:
    """recovery live: the torchft Lighthouse, through its own Service's name: a pod of its
    own, so losing the store's pod costs it nothing, and a replacement answers there."""
    return f"http://{lighthouse_service_name(job)}.{job.namespace}.svc:{lighthouse_port(job)}"


def torchrun_max_restarts(job: TrainingJob) -> int:
    """torchrun restarts its workers on every membership change, not only on failures.

    Each replaced or resized worker causes up to two changes (leave, join) for every
    survivor, so the agents' budget covers the job's failure budget plus those changes; the
    operator enforces ``failurePolicy.maxRestarts`` itself at the pod level.
    """
    replicas = job.spec.replicas
    return job.spec.failure_policy.max_restarts + 2 * (replicas.max + replicas.spares) + 2


def shutdown_timeout(job: TrainingJob) -> int:
    """How long torchrun lets its workers finish after SIGTERM before it SIGKILLs them: the
    pod's grace period less a moment for the launcher to report. torchrun's own default (30 s)
    would cut an emergency checkpoint short whatever terminationGracePeriodSeconds says."""
    grace = job.spec.checkpoint.termination_grace_period_seconds
    return max(1, grace - SHUTDOWN_MARGIN_SECONDS)


def torchrun_args(
    job: TrainingJob,
    endpoint: str | None = None,
    local_addr: str = "$(POD_IP)",
    nproc: int | str | None = None,
    index: int | None = None,
    incarnation: str = "",
) -> list[str]:
    """The worker's command: torchrun (through torchkube's launcher, which passes the worker
    exit code on and stops on permanent errors; see torchkube/elastic/launch.py).

    ``endpoint``, ``local_addr`` and ``nproc`` let ``torchkube run`` start the same command on
    loopback instead of in pods. With ``failurePolicy.recovery: live`` each pod (slot
    ``index``) is a rendezvous of its own: its loss must not end the others' round, which
    torchft's quorum spans instead (torchkube/trainer/live.py); each ``incarnation`` of the
    slot gets a new one, so a replacement never waits behind its dead predecessor's round."""
    spec = job.spec
    rdzv = spec.rendezvous
    replicas = spec.replicas
    nnodes = str(replicas.max) if replicas.min == replicas.max else f"{replicas.min}:{replicas.max}"
    rdzv_id = job.uid
    if live(job):
        if index is None:
            raise ValueError("recovery live: each pod's rendezvous needs its slot index")
        nnodes, rdzv_id = "1", f"{job.uid}-group-{index}-{incarnation}"
    rdzv_conf = ",".join(
        [
            "is_host=false",
            f"join_timeout={rdzv.join_timeout_seconds}",
            f"last_call_timeout={rdzv.last_call_timeout_seconds}",
            f"close_timeout={rdzv.close_timeout_seconds}",
            f"keep_alive_interval={rdzv.keep_alive_interval_seconds}",
            f"keep_alive_max_attempt={KEEP_ALIVE_MAX_ATTEMPTS}",
        ]
    )
    return [
        "python",
        "-m",
        "torchkube.elastic.launch",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={spec.nproc_per_node if nproc is None else nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint or rendezvous_endpoint(job)}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf={rdzv_conf}",
        f"--max-restarts={torchrun_max_restarts(job)}",
        f"--monitor-interval={TORCHRUN_MONITOR_INTERVAL}",
        f"--shutdown-timeout={shutdown_timeout(job)}",
        f"--local-addr={local_addr}",
        *spec.command,
        *spec.args,
    ]


def trainer_env(job: TrainingJob, index: int) -> dict[str, str]:
    """The environment of :class:`torchkube.api.contract.Env` for slot ``index``: who the
    worker is, every checkpoint setting, the hang timeout, the trainer's spec. A pod adds its
    downward-API names and the user's ``spec.env``; ``torchkube run`` its own paths and
    ports."""
    spec = job.spec
    ckpt = spec.checkpoint
    hang = spec.failure_policy.hang_timeout_seconds
    return {
        "PYTHONUNBUFFERED": "1",
        Env.JOB_NAME: job.name,
        Env.JOB_NAMESPACE: job.namespace,
        Env.REPLICA_INDEX: str(index),
        Env.CHECKPOINT_DIR: ckpt.mount_path,
        Env.CHECKPOINT_INTERVAL_STEPS: str(ckpt.interval_steps),
        Env.CHECKPOINT_INTERVAL_SECONDS: str(ckpt.interval_seconds or 0),
        Env.CHECKPOINT_KEEP: str(ckpt.keep),
        Env.CHECKPOINT_MODE: ckpt.mode,
        Env.METRICS_PORT: str(spec.metrics.port if spec.metrics.enabled else 0),
        Env.HANG_TIMEOUT_SECONDS: "" if hang is None else str(hang),
        Env.TRAINER_CONFIG: json.dumps(spec.trainer_config().to_wire(), sort_keys=True),
        Env.RESTART_BOARD: job.uid,
        Env.RECOVERY: spec.failure_policy.recovery,
        **(
            {
                Env.LIGHTHOUSE: lighthouse_endpoint(job),
                Env.REPLICA_GROUPS: str(spec.replicas.target),
            }
            if live(job)
            else {}
        ),
    }
