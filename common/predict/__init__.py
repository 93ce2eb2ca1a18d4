"""bench.predict's model: a training step of a layout on hardware no one here holds, from measured parts.
Framework-free and record-shaped (it imports no framework, never bench or backends). step.py holds the one step
function; executed.py (BERT MLM, CNN, from a Basis: basis.py, work.py) and kernels.py (a decoder kernel by
kernel: decoder.py, gpu_compute.py, stacks.py) time a layout's stages; memory.py, collectives.py and hardware.py
are shared; validation.py and published.py hold it against runs. docs/prediction.md, docs/prediction-at-scale.md."""
