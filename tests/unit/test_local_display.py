"""What ``torchkube run`` prints while training: the trainer's tokens/s is its last log
window's, and the progress line says so."""

from torchkube.api.contract import ProgressReport
from torchkube.local.display import progress_line


def test_the_progress_lines_throughput_is_named_as_the_window() -> None:
    report = ProgressReport(step=200, total_steps=200, tokens_per_second=43443.0, world_size=2)
    line = progress_line(report, 1, 46.0, window=10)
    assert "43.4k tok/s (last 10 steps)" in line, line
