"""bench.predict's model: a training step of a layout on hardware no one here holds, from measured parts.

Framework-free and record-shaped (it reads records as dicts, imports no framework, never bench or backends):
  step.py         the one step function, predict(model, layout, batch, hardware, compute): stages put together
  prediction.py   what it works with and returns: Stages, Prediction
  executed.py     the executed workloads' stages (BERT MLM, CNN) as parbench runs them, from a Basis
  kernels.py      a decoder's stages timed kernel by kernel from a device's compute table (gpu_compute.py) and
                  its software stack (stacks.py), or an assumed MFU
  basis.py        the measured 1-device record a prediction starts from, or an assumed MFU (one rule)
  work.py         what each rank computes under a layout (multiply-adds per part of the model)
  memory.py       state, activations and buffers per rank, for the executed workloads and the decoders
  decoder.py      a decoder described in a model file (models/*.toml): parameters, GEMMs, FLOPs, activations
  hardware.py     the machine described in a file: devices per node, memory, link levels (alpha-beta)
  collectives.py  nccl-tests' bus-bandwidth factors, the alpha-beta cost, which link a group crosses
  validation.py   predicted against measured, run by run, for a results folder
  published.py    predicted against published GPU-cluster runs (published/*.toml)
docs/prediction.md and docs/prediction-at-scale.md give the formulas and their sources.
"""
