"""How many OpenMP threads each local worker process gets (``OMP_NUM_THREADS``).

One thread per process is right when the processes fill the cores, but it leaves cores idle
when they do not (a single worker on a 2-core machine computes on one of them). So the cores
are shared out evenly, rounded down so the processes never oversubscribe the machine, and a
user's own ``OMP_NUM_THREADS`` wins over this.
"""


def threads_per_process(cpus: int, workers: int, nproc_per_node: int | str) -> int:
    """Cores ÷ (workers × processes per worker), at least 1.

    ``nproc_per_node`` is torchrun's ``--nproc-per-node``: a count, or one of its words
    (``auto``, ``cpu``, ``gpu``), which start a process per core or per GPU; those get one
    thread each, as the count is not known here.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    text = str(nproc_per_node)
    if not text.isdigit() or int(text) < 1:
        return 1
    return max(1, cpus // (workers * int(text)))
