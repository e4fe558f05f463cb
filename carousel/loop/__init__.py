"""The server loop: run_cycle (cycle.py) and one module per step, the mount planner beside the pure plan."""
