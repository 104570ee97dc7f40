"""The ``torchkube`` command: one click group, its subcommands beside the code they drive.

The cluster commands live here: ``jobs`` does the API calls (through the ``kubernetes``
client, imported only when a command runs), ``errors`` turns whatever goes wrong into one
sentence that says what to do, ``render`` and ``pods`` are pure functions over the API's
objects (tables, descriptions, which pod holds rank 0), and ``cluster`` holds their click
commands. Keeping the I/O in one module is what lets the formatting be tested without a
cluster. ``torchkube run`` and ``plot`` are torchkube/local's, ``operator`` the operator's,
``prepare-data`` the trainer's.
"""
