"""Whose pod watches the API server closed (``bench.watchers``), read from the lines its
cacher logs at ``--v=1`` (kube-apiserver's ``cache_watcher.go``, as the testbed's runs)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ lives beside torchkube/

from bench import watchers

LINE = (
    "I1130 16:02:11.482113   40211 cache_watcher.go:203] Forcing pods watcher close due to "
    'unresponsiveness: key: "{key}", labels: "{labels}", fields: "{fields}". '
    "len(c.input) = 10, len(c.result) = 10, graceful = false\n"
)


def line(key: str = "/pods", labels: str = "", fields: str = "") -> str:
    return LINE.format(key=key, labels=labels, fields=fields)


def test_each_closed_pod_watch_is_named_by_its_key_and_selectors() -> None:
    log = "".join(
        [
            line(fields="status.phase!=Succeeded,status.phase!=Failed"),
            line(fields="status.phase!=Succeeded,status.phase!=Failed"),
            line(fields="spec.nodeName!="),
            line(labels="torchkube.io/job-name"),
            line(key="/pods/scale512-ab12", labels="torchkube.io/job-name"),
            line(key="/pods/kubeflow-a"),
            line(),
            line(labels="app=other"),
            "I1130 16:02:11.5 cacher.go:1] Forcing configmaps watcher close due to "
            'unresponsiveness: key: "/configmaps", labels: "", fields: "".\n',
            "I1130 16:02:12.0 httplog.go:1] something else\n",
        ]
    )
    assert watchers.closed_pod_watchers(log) == {
        "kube-scheduler": 2,
        "KWOK": 1,
        "torchkube's operator": 1,
        "the benchmark": 1,
        watchers.UNFILTERED: 1,
        watchers.NAMESPACED_UNFILTERED: 1,
        "/pods labels 'app=other' fields ''": 1,
    }


def test_a_trial_reads_only_what_was_logged_after_it_began(tmp_path: Path) -> None:
    log = tmp_path / "kube-apiserver.log"
    log.write_text(line(fields="spec.nodeName!="))
    offset = watchers.log_size(log)
    with log.open("a") as more:
        more.write(line(fields="status.phase!=Failed") * 3)
    assert watchers.closed_since(log, offset) == {"kube-scheduler": 3}
    assert watchers.said(watchers.closed_since(log, 0)) == "kube-scheduler 3, KWOK 1"
    assert watchers.closed_since(tmp_path / "missing.log", 0) == {}
    assert watchers.log_size(tmp_path / "missing.log") == 0
