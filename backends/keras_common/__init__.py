"""What the Keras 3 backends share, whatever Keras runs on (tf_mirrored: TensorFlow; keras_jax: JAX): the
two workload models, the initial-weight mapping and torch's AdamW. Nothing here imports a Keras backend:
the process chooses it (KERAS_BACKEND) before Keras is first imported."""
