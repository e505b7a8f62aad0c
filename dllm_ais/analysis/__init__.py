"""Looking at models and runs: evaluation, the pre-registered corrections study (plan, statistics), plots, the
likelihood-variance command and the benchmark environment record."""
