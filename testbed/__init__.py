"""A real Kubernetes control plane for tests and demos, built from source and run on 127.0.0.1.

Modules, one job each (see docs/cluster.md):

- ``binaries``: find or build (``hack/build-cluster.sh``) the pinned binaries.
- ``certs``, ``kubeconfig``: PKI and credentials for one run (free loopback ports come from
  ``torchkube.local.ports``, which ``torchkube run`` uses too).
- ``process``: a component as a process group with a log file.
- ``kwok``: fake GPU node pools and their failure domains (pure manifests).
- ``cluster``: ``Cluster`` starts and stops etcd, apiserver, controller-manager, scheduler, KWOK.
- ``faults``: failure injection (pod failure, deletion, preemption, node loss, cordon).
- ``pods``: test-pod builder and waits on pods and nodes.
- ``pytest_plugin``: session ``cluster`` fixture and friends; ``devcluster``: the CLI.
- ``operator`` (beside these): the operator as a process, for integration tests.

Nothing is imported here, so loading the pytest plugin or the CLI stays cheap.
"""
