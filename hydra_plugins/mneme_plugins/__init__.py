"""mneme's Hydra plugins: the experiments/ directory as the `experiment` config group, an Optuna (>= 4)
sweeper through ask/tell, and a launcher that runs jobs on the AsyncReplayExecutor's workers.

Hydra finds them because they live under the `hydra_plugins` namespace package.
"""
