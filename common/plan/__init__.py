"""bench.plan's search: which layout of N devices to run, chosen from bench.predict's model without trial runs.

Framework-free, like common.predict (it imports no framework, never bench or backends):
  space.py   every layout of N devices a layout name can say and common.layout validates (a backend's own refusals
             come in as a function)
  rank.py    each predicted (common.predict.step), ranked by step time, what decides between them, the ranking
             error within which two layouts cannot be separated
  fit.py     memory per device predicted before launch against a device's limit, allowing for the measured error
  check.py   the goals nox -s plan-check holds a plan to against exhaustive measurement
  decoders.py  bench.plan --model: a decoder LLM's layouts on a GPU cluster, from the decoders' step model and a
             device's compute table, and each published run's layout ranked in the plan for its cluster
docs/plan.md gives the rules and the figures.
"""
