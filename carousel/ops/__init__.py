"""Operations: metrics, the usage report, retention, workload export, structured logs, demo accounts."""
