"""The chaos driver: workload, nemeses, history and report (``python -m client.chaos``)."""

from client.chaos.runner import ChaosConfig, ChaosResult, run_chaos
from client.chaos.workload import WorkloadConfig

__all__ = ["ChaosConfig", "ChaosResult", "WorkloadConfig", "run_chaos"]
