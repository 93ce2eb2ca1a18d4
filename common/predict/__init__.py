"""bench.predict's model: a training step of a layout on hardware no one here holds, from measured parts.

Framework-free and record-shaped (it reads records as dicts, imports no framework, never bench or backends):
  hardware.py     the machine described in a file: devices per node, memory, link levels (alpha-beta)
  collectives.py  nccl-tests' bus-bandwidth factors, the alpha-beta cost, which link a group crosses
  work.py         what each rank computes under a layout (matmul FLOPs per part of the model)
  memory.py       parameters, gradients and optimizer state per rank as torch_3d counts them; activations
  step.py         one step's time and memory per rank: compute + exposed communication + bubble + optimizer
  basis.py        the measured 1-device record a prediction starts from, or an assumed MFU
  validation.py   predicted against measured, run by run, for a results folder
docs/prediction.md gives the formulas and their sources.
"""
