"""The cluster side of the ``torchkube`` command: submit, watch and steer TrainingJobs.

``jobs`` does the API calls (through the ``kubernetes`` client, imported only when a command
runs), ``errors`` turns whatever goes wrong into one sentence that says what to do, ``render``
and ``pods`` are pure functions over the API's dicts (tables, descriptions, which pod holds
rank 0), and ``cli`` holds the click commands. Keeping the I/O in one module is what lets the
formatting be tested without a cluster.
"""
