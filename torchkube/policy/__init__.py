"""The decisions ``torchkube run`` shares with the operator: pure functions of the API's types.

A failure is classified, accounted for and backed off from (``failures``, ``accounting``,
``backoff``), a straggler tracked (``stragglers``) and a job's Kueue queue read (``queue``)
by the same code on a laptop and in a cluster, so a job fails, or carries on, for the same
reasons in both. Nothing here reads a
pod or talks to Kubernetes: the operator's planner steps (``torchkube/operator/``) turn pods
into these calls, the local runner (``torchkube/local/``) its processes.
"""
