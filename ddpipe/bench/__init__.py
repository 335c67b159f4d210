"""``ddpipe bench``: will my GPUs wait for data, and which stage is to blame? (see measure.py)"""

from .measure import BenchOptions, BenchReport, format_report, plot_report, run_bench

__all__ = ["BenchOptions", "BenchReport", "format_report", "plot_report", "run_bench"]
