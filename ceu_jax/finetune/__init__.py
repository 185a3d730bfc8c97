"""CER on the project's real LM: SmolLM2-135M fine-tuned with low-rank adapters.

  task       the training task on the one training loop (`SmolLM2CERTask`: pairs,
             batches, the loss), `restore_trainable`
  objective  the CER objective on SmolLM2 (causal-tail or full recompute)
  evaluate   the evaluation of a fine-tuned (or the base) reader, and `run`: train,
             then evaluate (experiments/train_smollm2_cer.py)
Depends on `ceu_jax.pretrained` (the model, LoRA, patching) and `ceu_jax.readers`
(the SmolLM2 reader); neither depends on it.
"""
