"""``ddpipe bench``: will my GPUs wait for data, and which stage is to blame? (see measure.py)"""

from .figures import BenchReport
from .measure import BenchOptions, run_bench
from .report import format_report, plot_report

__all__ = ["BenchOptions", "BenchReport", "format_report", "plot_report", "run_bench"]
