"""bench.plan's search: which layout of N devices to run, chosen from bench.predict's model without trial runs.
Framework-free like common.predict: space.py (the executed workloads' layouts) and decoders.py (a decoder's on a
GPU cluster) enumerate, rank.py ranks and explains, fit.py checks memory, check.py holds the goals of
nox -s plan-check. docs/plan.md."""
