"""The benchmarks read the API server's own counters (``bench.kube.apiserver_samples``), here
from a real kube-apiserver, not from text we wrote. The fleet's "pod watches the API server
closed" is ``apiserver_terminated_watchers_total``, whose series appear only once a watch was
closed (none on an idle test cluster), so the reader is tested on apiserver_request_total,
which always has series."""

from typing import Any

import pytest
from kubernetes import client

from bench.kube import apiserver_samples, metric_delta

pytestmark = [pytest.mark.cluster]

REQUESTS = "apiserver_request_total"


def test_the_named_counters_alone_come_back_and_count_requests(api_client: Any) -> None:
    before = apiserver_samples(api_client, [REQUESTS])
    assert before, f"the API server exports no {REQUESTS}"
    assert {name for name, _ in before} == {REQUESTS}
    client.CoreV1Api(api_client).list_namespace()
    grown = metric_delta(before, apiserver_samples(api_client, [REQUESTS]), REQUESTS)
    lists = [dict(labels) for labels in grown]
    assert any(
        labels.get("verb") == "LIST" and labels.get("resource") == "namespaces" for labels in lists
    ), lists
