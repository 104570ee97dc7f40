"""An API client for the operator's writes: in-cluster credentials, else the kubeconfig."""

import os

from kubernetes import client, config

from torchkube.operator.config import OperatorSettings


def make_api_client(settings: OperatorSettings) -> client.ApiClient:
    """One client with a connection pool sized for the operator's parallel writes."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = settings.api_concurrency + 4
    return client.ApiClient(configuration)
