"""An API client for the operator's writes: in-cluster credentials, else the kubeconfig."""

import os

from kubernetes import client, config

from torchkube.operator.config import OperatorSettings


def write_threads(settings: OperatorSettings) -> int:
    """The threads that may send through the write client at once: the pool of pod creates
    and deletes (``Kube.pool``), the reconciles (one thread each, ``settings.workers`` at a
    time), the writes beside a plan's others (``Executor.beside``), the event lanes
    (``Executor.recorders``), and the leader's renewals. A pool smaller than that discards a
    connection at each return, and the next request pays a new TLS handshake."""
    return settings.api_concurrency + 3 * settings.workers + 1


def make_api_client(settings: OperatorSettings) -> client.ApiClient:
    """One client whose connection pool keeps a connection for every thread that writes."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = write_threads(settings)
    return client.ApiClient(configuration)
